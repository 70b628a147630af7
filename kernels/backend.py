"""The one switch between the PyTorch reference kernels and the Triton kernels.

:data:`BACKENDS` is the table: for each backend, the module that implements each group of ops
(model layers, sampling). :func:`set_backend` imports the chosen row once and keeps it;
:mod:`kernels.ops` forwards every call to :func:`selected` without importing anything. Until a
backend is set the torch reference serves, loaded on first use (so importing this package never
imports triton, and torch only when an op runs).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

BACKENDS: dict[str, dict[str, str]] = {
    "torch": {"layers": "specserve.kernels.ref_layers", "sampling": "specserve.kernels.ref_sampling"},
    "triton": {"layers": "specserve.kernels.triton_layers", "sampling": "specserve.kernels.triton_sampling"},
}


@dataclass(frozen=True)
class KernelBackend:
    """A row of :data:`BACKENDS`, imported: the modules the public ops forward to."""

    name: str
    layers: ModuleType     # rms_norm, add_rms_norm, apply_rotary, silu_and_mul, write_kv, ...
    sampling: ModuleType   # sample_draft, rejection_sample (and warm_up for triton)


_selected: Optional[KernelBackend] = None


def triton_available() -> bool:
    """True when Triton can launch kernels here (a CUDA device, or the CPU interpreter)."""
    try:
        import torch

        from specserve.kernels.interpreter import interpreting   # imports triton
    except Exception:
        return False
    return torch.cuda.is_available() or interpreting()


def _load(name: str) -> KernelBackend:
    row = BACKENDS[name]
    return KernelBackend(name, importlib.import_module(row["layers"]),
                         importlib.import_module(row["sampling"]))


def set_backend(name: str) -> None:
    """Select ``torch`` or ``triton`` for every op in :mod:`kernels.ops`."""
    global _selected
    if name not in BACKENDS:
        raise ValueError(f"unknown kernel backend {name!r}; expected 'torch' or 'triton'")
    if name == "triton" and not triton_available():
        raise RuntimeError("the triton kernel backend needs a CUDA device (or TRITON_INTERPRET=1)")
    _selected = _load(name)


def selected() -> KernelBackend:
    """The backend every op runs on (the torch reference until :func:`set_backend` says otherwise)."""
    global _selected
    if _selected is None:
        _selected = _load("torch")
    return _selected


def get_backend() -> str:
    return selected().name
