"""Whether this process runs its Triton kernels on the CPU interpreter (``TRITON_INTERPRET=1``).

Triton decides when a kernel is decorated (its module's import) whether it is interpreted, from
that environment variable, so this flag is read once, at import, like the JIT read it. The
kernels' CPU paths follow it: a while loop where the interpreter cannot run ``range`` to a
runtime bound, no programmatic dependent launch (kernels/triton_pdl.py)."""

from __future__ import annotations

import os

_INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1, set before the kernels' import)."""
    return _INTERPRETING
