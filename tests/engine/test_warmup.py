"""engine/runner/warmup.py: the start-up warm-up of the eager forward (run on CUDA; here forced
on CPU) fits the cache it is given, takes no blocks, and leaves no trace in what requests get."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from specserve.engine.runner.warmup import eager_shapes, warm_up_eager  # noqa: E402
from specserve.engine.types import SamplingParams  # noqa: E402


def test_warm_up_runs_every_shape_on_a_small_cache_and_leaves_outputs_unchanged(make_llm, prompts) -> None:
    kw = dict(draft_model="qwen2", num_speculative_tokens=3, num_kv_blocks=12, max_model_len=160)
    cold, warmed = make_llm("llama", **kw), make_llm("llama", **kw)
    rows = 4
    shapes = eager_shapes(rows)
    assert warm_up_eager(warmed.core.runner, rows) == 0          # CUDA only by default
    ran = warm_up_eager(warmed.core.runner, rows, cuda_only=False)
    # the target runs each shape once, and a mixed step beside it when several requests; the draft once
    assert ran == sum(2 if n > 1 else 1 for n, _ in shapes) + len(shapes)
    warmed.core.kv.pool.check_all_free()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batch = prompts([7, 30, 17], seed=3)
    want = [o.outputs[0].token_ids for o in cold.generate(batch, params)]
    got = [o.outputs[0].token_ids for o in warmed.generate(batch, params)]
    assert got == want


def test_the_target_warm_up_stays_within_the_step_token_budget(make_llm) -> None:
    """With --max-num-batched-tokens 48 no target forward of the warm-up is larger than a step
    can be (rows x 128 tokens and the long chunk, 159 tokens at this max_model_len, would be),
    a 48-token chunk is warmed instead, and the draft still runs every shape (its catch-up, one
    KV-only forward over every lagging token, is not cut to the budget)."""
    llm = make_llm("llama", draft_model="qwen2", num_speculative_tokens=3, max_model_len=160)
    runner = llm.core.runner
    seen: list[tuple[str, int]] = []
    forward = runner._forward

    def spy(which, batch, *args, **kwargs):
        seen.append((which, sum(len(item.token_ids) for item in batch)))
        return forward(which, batch, *args, **kwargs)

    runner._forward = spy
    try:
        warm_up_eager(runner, 4, cuda_only=False, max_tokens=48)
    finally:
        runner._forward = forward
    target = [n for which, n in seen if which == "target"]
    draft = [n for which, n in seen if which == "draft"]
    assert max(target) == 48 and all(n <= 48 for n in target)
    assert len(draft) == len(eager_shapes(4)) + 1 and max(draft) > 48
