"""The one switch between the PyTorch reference kernels and the Triton kernels."""

from __future__ import annotations

import os

_BACKEND = "torch"


def triton_available() -> bool:
    """True when Triton can launch kernels here (a CUDA device, or the CPU interpreter)."""
    try:
        import torch
        import triton  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"


def set_backend(name: str) -> None:
    """Select ``torch`` or ``triton`` for every op in :mod:`kernels.ops`."""
    global _BACKEND
    if name not in ("torch", "triton"):
        raise ValueError(f"unknown kernel backend {name!r}; expected 'torch' or 'triton'")
    if name == "triton" and not triton_available():
        raise RuntimeError("the triton kernel backend needs a CUDA device (or TRITON_INTERPRET=1)")
    _BACKEND = name


def get_backend() -> str:
    return _BACKEND
