"""Whether this process runs its Triton kernels on the CPU interpreter (``TRITON_INTERPRET``).

Triton decides when a kernel is decorated (its module's import) whether it is interpreted, from
its ``runtime.interpret`` knob (the environment variable, which it also reads as ``true``, ``on``
or ``yes``), so this flag is read once, at import, from the same knob. The kernels' CPU paths
follow it: a while loop where the interpreter cannot run ``range`` to a runtime bound, and no
programmatic dependent launch (kernels/triton_pdl.py)."""

from __future__ import annotations

import os

import triton


def _read() -> bool:
    knobs = getattr(triton, "knobs", None)       # Triton 3.4 and later
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


_INTERPRETING = _read()


def interpreting() -> bool:
    """True under Triton's CPU interpreter (set before the kernels' import)."""
    return _INTERPRETING
