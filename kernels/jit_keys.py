"""Triton's cache keys of a module's kernels, computed at its import in one fixed order.

Triton keys a compiled kernel in its on-disk cache by the JIT function's ``cache_key``: a hash
of its source, of each JIT function it calls, and of the constexpr globals it and its callees
read. Triton 3.6 merges a callee's globals into the caller's before it computes the callee's key
(``DependenciesFinder._update_hash``), so a callee whose key is not computed yet contributes no
globals: a kernel's key then depends on which kernels this process launched first. On an H200
the compile workers of kernels/precompile.py, each launching its share of the warm-up, keyed
final_race_kernel and finalize_kernel differently from the server, whose warm-up compiled them
again (65 of 102 kernels at 32 sequences and k = 4). ``settle_cache_keys`` at the end of each
kernel module computes every key in definition order (helpers before the kernels that call
them), so every process that imports the module agrees on them.
"""

from __future__ import annotations

import triton


def settle_cache_keys(namespace: dict) -> int:
    """Compute the ``cache_key`` of every JIT function in ``namespace`` (a module's globals),
    in insertion order; interpreted functions (TRITON_INTERPRET) have none and are skipped.
    Returns how many were computed."""
    count = 0
    for value in list(namespace.values()):
        if isinstance(value, triton.runtime.JITFunction):
            _ = value.cache_key
            count += 1
    return count
