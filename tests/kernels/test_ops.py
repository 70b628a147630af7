"""kernels/ops.py and kernels/backend.py: the public ops forward to the backend chosen once.

The table (:data:`backend.BACKENDS`) is imported when a backend is set; a call through ``ops``
imports nothing, and every public op exists in every backend's module for its group.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest
import torch

from specserve.kernels import backend, ops

LAYER_OPS = ("linear", "set_gemv", "rms_norm", "add_rms_norm", "add_rms_norm_linear", "apply_rotary",
             "silu_and_mul", "silu_mul_linear", "write_kv", "attention_prologue", "paged_attention",
             "decoder_layer", "set_fused_layer", "fused_layer_enabled", "attention_with_prologue",
             "set_decode_fusion", "set_pdl", "pdl_scope")
SAMPLING_OPS = ("sample_draft", "rejection_sample")


@pytest.fixture(autouse=True)
def torch_backend_after():
    yield
    backend.set_backend("torch")


def test_every_public_op_is_forwarded_and_implemented_by_every_backend() -> None:
    public = {name for name, f in inspect.getmembers(ops, inspect.isfunction)
              if f.__module__ == ops.__name__}
    assert public == {*LAYER_OPS, *SAMPLING_OPS, "warm_up_sampling"}
    for row in backend.BACKENDS.values():
        if "triton" in row["layers"] and importlib.util.find_spec("triton") is None:
            continue
        layers, sampling = (importlib.import_module(row[g]) for g in ("layers", "sampling"))
        assert all(callable(getattr(layers, name, None)) for name in LAYER_OPS), row
        assert all(callable(getattr(sampling, name, None)) for name in SAMPLING_OPS), row


def test_the_torch_reference_serves_until_a_backend_is_set() -> None:
    backend.set_backend("torch")
    chosen = backend.selected()
    assert backend.get_backend() == "torch" and chosen.name == "torch"
    assert chosen.layers.__name__ == "specserve.kernels.ref_layers"
    assert chosen.sampling.__name__ == "specserve.kernels.ref_sampling"
    assert backend.selected() is chosen   # kept, not rebuilt per call


def test_a_call_through_ops_imports_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    backend.set_backend("torch")

    def no_import(name, *args, **kwargs):
        raise AssertionError(f"ops imported {name} during a call")

    monkeypatch.setattr(importlib, "import_module", no_import)
    x, w = torch.randn(3, 8), torch.rand(8)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6), backend.selected().layers.rms_norm(x, w, 1e-6))
    assert torch.equal(ops.silu_and_mul(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])
    assert ops.warm_up_sampling(16, 2, 2, "probabilistic", True, True, torch.float32, "cpu") == 0


def test_unknown_or_unavailable_backend_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown kernel backend"):
        backend.set_backend("cuda")
    monkeypatch.setattr(backend, "triton_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        backend.set_backend("triton")
    assert backend.get_backend() == "torch"
