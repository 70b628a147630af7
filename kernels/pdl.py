"""Programmatic dependent launch (PDL) for the model-layer kernels.

At decode batch sizes a forward is a chain of a few hundred short kernels (a 0.6B draft: about
nine per layer), and each boundary costs the GPU a drain of the last kernel's final wave plus
the next kernel's launch and ramp-up, with the SMs mostly idle. On Hopper and later a kernel
launched with the *programmatic stream serialization* attribute may start while the kernel
before it is still running; it calls ``griddepcontrol.wait`` before touching anything the earlier
kernel wrote, and the earlier kernel calls ``griddepcontrol.launch_dependents`` to let it be
scheduled. CUDA graph capture keeps these edges, so the captured decode and draft graphs get the
overlap too.

The contract every kernel launched with PDL keeps (see :func:`pdl_begin`):

* its first instructions are the wait, then the trigger, on every path (a program that returns
  before the wait would let a later kernel see this one finished while the one before it is
  still writing);
* nothing is loaded or stored before the wait: inputs may come from the kernel before, and an
  output buffer may be memory the kernel before is still reading (the caching allocator hands a
  freed block to the next allocation in stream order).

Off on CPUs, under Triton's interpreter, on GPUs before sm_90, and with ``--no-pdl``
(:func:`set_enabled`). Switching it changes only the launch, never a result.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.4 (the versions this project runs ship it)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - an older Triton: PDL stays off
    gdc_launch_dependents = gdc_wait = None

__all__ = ["enabled", "set_enabled", "launch_options", "pdl_begin"]

# The policy switch: on unless the engine was started with --no-pdl (engine/setup.py calls
# ops.set_pdl). Graphs already captured keep the launches they were captured with.
_enabled = True


def enabled() -> bool:
    return _enabled


def set_enabled(flag: bool) -> None:
    global _enabled
    _enabled = bool(flag)


@functools.lru_cache(maxsize=None)
def _device_supports(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] >= 9


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def active(t: torch.Tensor) -> bool:
    """Whether a kernel writing or reading ``t`` launches with PDL now."""
    return (_enabled and gdc_wait is not None and t.is_cuda and not _interpreting()
            and _device_supports(t.device))


def launch_options(t: torch.Tensor) -> dict:
    """Keyword arguments for a ``kernel[grid](...)`` launch on ``t``'s device: the kernel's
    ``PDL`` constexpr, and Triton's ``launch_pdl`` option when it is on."""
    if active(t):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}


@triton.jit
def pdl_begin(PDL: tl.constexpr):
    """The first statement of a kernel launched with :func:`launch_options`: wait until the
    kernel before has finished and its writes are visible, then let the next kernel launch
    (it waits in turn before it reads anything this one writes). Nothing without PDL."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
