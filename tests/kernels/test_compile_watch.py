"""kernels/compile_watch.py reports each compile through Triton's runtime hooks."""

import pytest

from specserve.kernels.compile_watch import watch_compiles

knobs = pytest.importorskip("triton").knobs


def test_a_compile_between_the_hooks_is_reported_with_its_duration() -> None:
    runtime = knobs.runtime
    saved = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    seen = []
    try:
        runtime.jit_cache_hook = runtime.jit_post_compile_hook = None
        assert watch_compiles(lambda kernel, seconds: seen.append((kernel, seconds)))
        assert runtime.jit_cache_hook(key=("k", 1), repr="rms_norm[...](x: *bf16)") is False   # compile goes on
        runtime.jit_post_compile_hook(key=("k", 1), repr="rms_norm[...](x: *bf16)")
        runtime.jit_post_compile_hook(key=("other",), repr="sample_kernel[...]")   # no start seen
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = saved
    assert [k for k, _ in seen] == ["rms_norm[...](x: *bf16)", "sample_kernel[...]"]
    assert seen[0][1] >= 0.0 and seen[1][1] == 0.0


def test_a_variant_is_described_by_its_constexprs_and_integer_specialisations() -> None:
    from types import SimpleNamespace

    from specserve.kernels.compile_watch import describe

    # the shape of Triton 3.6's hook arguments: signature by name, constants and attributes by path
    compile_args = {
        "signature": {"q_ptr": "*bf16", "num_tokens": "i32", "num_seqs": "i32", "one": "constexpr",
                      "BLOCK": "constexpr"},
        "constants": {(3,): 1, (4,): SimpleNamespace(value=64)},
        "configs": [{(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): []}],
    }
    fn = SimpleNamespace(name="_paged_attention_kernel")
    assert describe({"fn": fn, "key": "(...)", "repr": "r", "compile": compile_args}) == \
        "_paged_attention_kernel(num_tokens:16, num_seqs:-, one=1, BLOCK=64)"
    assert describe({"fn": fn, "key": "(...)", "repr": "triton's repr"}) == "triton's repr"


def test_hooks_set_before_keep_running_and_a_second_watch_replaces_the_first() -> None:
    runtime = knobs.runtime
    saved = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    theirs, first, second = [], [], []
    try:
        runtime.jit_cache_hook = lambda **kw: theirs.append("before") or False
        runtime.jit_post_compile_hook = lambda **kw: theirs.append("after")
        watch_compiles(lambda kernel, seconds: first.append(kernel))
        watch_compiles(lambda kernel, seconds: second.append(kernel))
        assert runtime.jit_cache_hook(key="(k)", repr="a") is False
        runtime.jit_post_compile_hook(key="(k)", repr="a")
    finally:
        runtime.jit_cache_hook, runtime.jit_post_compile_hook = saved
    assert theirs == ["before", "after"] and first == [] and second == ["a"]
