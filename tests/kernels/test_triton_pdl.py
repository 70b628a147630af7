"""When kernels launch with programmatic dependent launch (kernels/triton_pdl.py): a model's
kernels only inside its scope, for a model of hidden size up to MAX_HIDDEN (the 0.6B-like draft
gained on an H100, the 1.7B- and 8B-like models lost at one row), and for a larger model's
forward of LARGE_MODEL_ROWS token rows (the 8B-like gained at 2-8); the sampler wherever its
tuning asks (``usable``); always on a GPU that has it, not under the interpreter, and not after
``set_pdl(False)``. The GPU test (tests/gpu/test_pdl_gpu.py) checks
what it computes."""

from __future__ import annotations

from types import SimpleNamespace

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


@pytest.mark.parametrize("tokens", [1, 3])
def test_the_model_runs_its_layers_and_head_in_its_scope(monkeypatch, tokens: int) -> None:
    """LlamaFamilyModel's layers, final norm and LM head launch inside pdl_scope(hidden size,
    token rows): one request's forward of ``tokens`` tokens gives ``tokens`` rows everywhere,
    also to the head when it computes only the last token's logits and is told the forward's
    rows (as the runner does); told nothing, the head counts its own rows."""
    import tempfile

    import torch

    from specserve.bench import shapes
    from specserve.engine.models.llama import AttentionMetadata
    from specserve.engine.models.loader import load_model
    from specserve.engine.models.spec import read_model_spec
    from specserve.kernels import backend, ops

    backend.set_backend("torch")
    seen: dict[str, list] = {"linear": [], "add_rms_norm": []}

    def spy(name: str):
        real = getattr(ops, name)

        def call(*args, **kwargs):
            seen[name].append((triton_pdl._model_hidden, triton_pdl._model_rows))
            return real(*args, **kwargs)
        return call

    spec = read_model_spec(shapes.write_checkpoint(tempfile.mkdtemp(), shapes.TINY_DRAFT))
    model = load_model(spec, torch.device("cpu"), torch.float32, 64, "dummy", 0)
    for name in seen:                  # the projections and LM head; the final norm
        monkeypatch.setattr(ops, name, spy(name))
    # the torch backend's scope is a no-op: the Triton backend's (plain Python) stands in
    monkeypatch.setattr(ops, "pdl_scope", triton_pdl.model_scope)
    meta = AttentionMetadata(torch.arange(tokens), torch.zeros((1, 1), dtype=torch.int32),
                             torch.tensor([0, tokens], dtype=torch.int32),
                             torch.tensor([tokens], dtype=torch.int32), tokens, 16)
    kv = [(torch.zeros(2, 16, spec.num_kv_heads, spec.head_dim),
           torch.zeros(2, 16, spec.num_kv_heads, spec.head_dim)) for _ in range(spec.num_layers)]
    with torch.inference_mode():
        hidden = model(torch.arange(3, 3 + tokens), torch.arange(tokens), meta, kv)
        model.compute_logits(hidden[-1:], rows=hidden.shape[0])
    assert all(seen.values()) and all(set(v) == {(spec.hidden_size, tokens)}
                                      for v in seen.values()), seen
    assert triton_pdl._model_hidden is None and triton_pdl._model_rows is None
    seen["linear"].clear()
    with torch.inference_mode():
        model.compute_logits(hidden[-1:])
    assert seen["linear"] == [(spec.hidden_size, 1)]


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
