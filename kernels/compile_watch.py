"""Noticing Triton compiles that happen after start-up.

Every kernel variant a server needs should be compiled before its first request (the engine's
start-up traffic and the runner's warm-up see to it). One that is not costs the request that meets
it a compile, 0.2-0.9 s on an H100. ``watch_compiles`` reports each compile from then on, so an
operator sees the kernel and its specialisation in the log instead of an unexplained latency spike.
"""

from __future__ import annotations

import time
from typing import Callable


def watch_compiles(report: Callable[[str, float], None]) -> bool:
    """From now on call ``report(kernel, seconds)`` after every Triton compile in this process
    (a variant new to this process: compiled, or loaded from Triton's disk cache). Replaces an
    earlier watch. False where this Triton has no compile hooks."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    started: dict[str, float] = {}

    def before(**kw) -> bool:
        started[str(kw.get("key"))] = time.perf_counter()
        return False   # go on and compile

    def after(**kw) -> None:
        t0 = started.pop(str(kw.get("key")), None)
        report(describe(kw), time.perf_counter() - t0 if t0 is not None else 0.0)

    runtime.jit_cache_hook = before
    runtime.jit_post_compile_hook = after
    return True


def describe(hook_kwargs: dict) -> str:
    """``kernel(arg=value, n:16, m:1, ...)``: the kernel's name, its constexpr values and how
    each integer argument was specialised (``16``: a multiple of 16, ``1``: equal to 1, ``-``:
    neither), which is what tells one variant from another. Falls back to Triton's own repr."""
    fn, key = hook_kwargs.get("fn"), hook_kwargs.get("key")
    try:
        jit = fn.jit_function
        parts = []
        for arg, (kind, spec) in zip(jit.arg_names, key[0]):
            if kind == "constexpr":
                parts.append(f"{arg}={spec}")
            elif kind[:1] in ("i", "u") and kind != "u1":
                parts.append(f"{arg}:{_SPEC.get(spec, '-')}")
        return f"{fn.name}({', '.join(parts)})"
    except (AttributeError, TypeError, ValueError, IndexError):
        return str(hook_kwargs.get("repr", "?"))[:300]


_SPEC = {"D": "16", "1": "1"}
