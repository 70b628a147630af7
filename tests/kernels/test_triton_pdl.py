"""When kernels launch with programmatic dependent launch (kernels/triton_pdl.py): a model's
kernels only inside its scope, for a model of hidden size up to MAX_HIDDEN (the 0.6B-like draft
gained on an H100, the 1.7B- and 8B-like models lost at one row), and for a larger model's
forward of LARGE_MODEL_ROWS token rows (the 8B-like gained at 2-8); the sampler wherever its
tuning asks (``usable``); always on a GPU that has it, not under the interpreter, and not after
``set_pdl(False)``. The GPU test (tests/gpu/test_pdl_gpu.py) checks
what it computes."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import pytest

from specserve.kernels import triton_pdl

CUDA_TENSOR = SimpleNamespace(is_cuda=True, device="cuda:0")   # what ``active`` reads of x


@pytest.fixture(autouse=True)
def _a_gpu_with_pdl(monkeypatch):
    """A GPU that has PDL, outside the interpreter (also when the suite runs under it)."""
    monkeypatch.setattr(triton_pdl, "_supported", lambda device: True)
    monkeypatch.setattr(triton_pdl, "interpreting", lambda: False)
    yield
    triton_pdl.set_enabled(True)


def test_only_inside_a_small_models_scope() -> None:
    assert not triton_pdl.active(CUDA_TENSOR)
    with triton_pdl.model_scope(triton_pdl.MAX_HIDDEN):
        assert triton_pdl.active(CUDA_TENSOR)
        with triton_pdl.model_scope(2048):          # a larger model called from inside
            assert not triton_pdl.active(CUDA_TENSOR)
        assert triton_pdl.active(CUDA_TENSOR)
    assert not triton_pdl.active(CUDA_TENSOR)


def test_off_when_switched_off_interpreting_or_on_the_cpu(monkeypatch) -> None:
    with triton_pdl.model_scope(1024):
        assert triton_pdl.active(CUDA_TENSOR)
        with monkeypatch.context() as m:
            m.setattr(triton_pdl, "interpreting", lambda: True)
            assert not triton_pdl.active(CUDA_TENSOR)
        assert not triton_pdl.active(SimpleNamespace(is_cuda=False, device="cpu"))
        triton_pdl.set_enabled(False)
        assert not triton_pdl.active(CUDA_TENSOR)


def test_usable_outside_a_model_scope_but_not_on_the_cpu_interpreting_or_switched_off(monkeypatch) -> None:
    """``usable`` (the sampler's test) needs no model scope; the rest of ``active``'s
    conditions hold for it."""
    assert triton_pdl.usable(CUDA_TENSOR) and not triton_pdl.active(CUDA_TENSOR)
    assert not triton_pdl.usable(SimpleNamespace(is_cuda=False, device="cpu"))
    with monkeypatch.context() as m:
        m.setattr(triton_pdl, "interpreting", lambda: True)
        assert not triton_pdl.usable(CUDA_TENSOR)
    with monkeypatch.context() as m:
        m.setattr(triton_pdl, "_supported", lambda device: False)
        assert not triton_pdl.usable(CUDA_TENSOR)
    triton_pdl.set_enabled(False)
    assert not triton_pdl.usable(CUDA_TENSOR)


def _scopes_seen(monkeypatch, model, tokens: int, logits_rows: Optional[int]) -> dict[str, list]:
    """(hidden size, rows) of the PDL scope around each projection / LM head (``linear``) and
    RMSNorm with residual (``add_rms_norm``) of one request's forward over ``tokens`` tokens,
    then the head over its last token told ``logits_rows``."""
    import torch

    from specserve.engine.models.llama import AttentionMetadata
    from specserve.kernels import ops

    seen: dict[str, list] = {"linear": [], "add_rms_norm": []}

    def spy(name: str):
        real = getattr(ops, name)

        def call(*args, **kwargs):
            seen[name].append((triton_pdl._model_hidden, triton_pdl._model_rows))
            return real(*args, **kwargs)
        return call

    for name in seen:
        monkeypatch.setattr(ops, name, spy(name))
    # the torch backend's scope is a no-op: the Triton backend's (plain Python) stands in
    monkeypatch.setattr(ops, "pdl_scope", triton_pdl.model_scope)
    spec = model.kv_spec if hasattr(model, "kv_spec") else model.spec
    meta = AttentionMetadata(torch.arange(tokens), torch.zeros((1, 1), dtype=torch.int32),
                             torch.tensor([0, tokens], dtype=torch.int32),
                             torch.tensor([tokens], dtype=torch.int32), tokens, 16)
    kv = [(torch.zeros(2, 16, spec.num_kv_heads, spec.head_dim),
           torch.zeros(2, 16, spec.num_kv_heads, spec.head_dim)) for _ in range(spec.num_layers)]
    with torch.inference_mode():
        hidden = model(torch.arange(3, 3 + tokens), torch.arange(tokens), meta, kv)
        model.compute_logits(hidden[-1:], rows=logits_rows)
    assert triton_pdl._model_hidden is None and triton_pdl._model_rows is None
    return seen


def _tiny_model(group=None):
    import tempfile

    import torch

    from specserve.bench import shapes
    from specserve.engine.models.loader import load_model
    from specserve.engine.models.spec import read_model_spec
    from specserve.kernels import backend

    backend.set_backend("torch")
    spec = read_model_spec(shapes.write_checkpoint(tempfile.mkdtemp(), shapes.TINY_TARGET))
    return spec, load_model(spec, torch.device("cpu"), torch.float32, 64, "dummy", 0, group=group)


@pytest.mark.parametrize("tokens", [1, 3])
def test_the_model_runs_its_layers_and_head_in_its_scope(monkeypatch, tokens: int) -> None:
    """LlamaFamilyModel's layers, final norm and LM head launch inside pdl_scope(hidden size,
    token rows): one request's forward of ``tokens`` tokens gives ``tokens`` rows everywhere,
    also to the head when it computes only the last token's logits and is told the forward's
    rows (as the runner does); told nothing, the head counts its own rows."""
    spec, model = _tiny_model()
    seen = _scopes_seen(monkeypatch, model, tokens, logits_rows=tokens)
    assert all(seen.values()) and all(set(v) == {(spec.hidden_size, tokens)}
                                      for v in seen.values()), seen
    seen = _scopes_seen(monkeypatch, model, tokens, logits_rows=None)
    assert seen["linear"][-1] == (spec.hidden_size, 1)


def test_a_tensor_parallel_shard_names_no_rows(monkeypatch) -> None:
    """A tensor-parallel shard (ParallelLlamaModel, here one gloo rank) runs its layers and
    final norm in its model's scope with no rows: the large-model row rule, measured on one
    GPU, does not reach it (its vocabulary-parallel head launches outside a scope)."""
    from specserve.engine.distributed.group import Rendezvous, TPGroup, open_store

    store, port = open_store(1)
    group = TPGroup(Rendezvous("127.0.0.1", port, 1, "gloo"), 0, store)
    spec, model = _tiny_model(group)
    assert type(model).__name__ == "ParallelLlamaModel"
    seen = _scopes_seen(monkeypatch, model, 3, logits_rows=3)
    assert seen["add_rms_norm"] and set(seen["add_rms_norm"]) == {(spec.hidden_size, None)}, seen


def test_a_large_models_kernels_only_for_the_families_named(monkeypatch) -> None:
    """Above MAX_HIDDEN a kernel uses PDL only if its family is in LARGE_MODEL_FAMILIES (the A/B
    knob of scripts/fused_layer_ab.py); in a small model every family does."""
    with triton_pdl.model_scope(4096, rows=1):
        assert not any(triton_pdl.active(CUDA_TENSOR, f) for f in triton_pdl.FAMILIES)
        monkeypatch.setattr(triton_pdl, "LARGE_MODEL_FAMILIES", frozenset({"attention", "norm"}))
        assert [triton_pdl.active(CUDA_TENSOR, f) for f in triton_pdl.FAMILIES] == \
            [f in ("attention", "norm") for f in triton_pdl.FAMILIES]
        assert not triton_pdl.active(CUDA_TENSOR)    # a launch that names no family
        triton_pdl.set_enabled(False)
        assert not triton_pdl.active(CUDA_TENSOR, "attention")
    triton_pdl.set_enabled(True)
    with triton_pdl.model_scope(triton_pdl.MAX_HIDDEN):
        assert all(triton_pdl.active(CUDA_TENSOR, f) for f in triton_pdl.FAMILIES)


@pytest.mark.parametrize("rows, want", [(None, False), (1, False), (2, True), (4, True),
                                        (8, True), (9, False), (16, False), (256, False)])
def test_a_large_models_forward_by_its_token_rows(rows, want: bool) -> None:
    """Above MAX_HIDDEN every family launches with PDL in a forward of 2-8 token rows (the
    8B-like on an H100: 0.97x at 1 row, 1.03x at 2, 4 and 8, 1.01x at 16); a small model's
    forward at any row count; a scope that names no rows counts as a large model's one row."""
    with triton_pdl.model_scope(4096, rows):
        assert [triton_pdl.active(CUDA_TENSOR, f) for f in (*triton_pdl.FAMILIES, "")] == \
            [want] * (len(triton_pdl.FAMILIES) + 1)
        with triton_pdl.model_scope(triton_pdl.MAX_HIDDEN, rows):    # a draft called inside
            assert triton_pdl.active(CUDA_TENSOR, "gemv")
        triton_pdl.set_enabled(False)
        assert not triton_pdl.active(CUDA_TENSOR, "gemv")
