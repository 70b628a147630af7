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
    (a variant new to this process: compiled, or loaded from Triton's disk cache). Hooks set
    before it keep running; an earlier watch is replaced. False where this Triton has no
    compile hooks."""
    try:
        from triton import knobs
    except ImportError:
        return False
    runtime = getattr(knobs, "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    started: dict[tuple[str, str], float] = {}
    # hooks installed before ours (another library's, or an earlier watch's) still run
    prev_before, prev_after = runtime.jit_cache_hook, runtime.jit_post_compile_hook
    while getattr(prev_before, "_watch_previous", None) is not None:   # an earlier watch: unwrap
        prev_before, prev_after = prev_before._watch_previous

    def ident(kw: dict) -> tuple[str, str]:   # the key alone is the specialisation, not the kernel
        return getattr(kw.get("fn"), "name", "?"), str(kw.get("key"))

    def before(**kw) -> bool:
        started[ident(kw)] = time.perf_counter()
        return bool(prev_before(**kw)) if prev_before is not None else False   # False: compile

    def after(**kw) -> None:
        t0 = started.pop(ident(kw), None)
        report(describe(kw), time.perf_counter() - t0 if t0 is not None else 0.0)
        if prev_after is not None:
            prev_after(**kw)

    before._watch_previous = (prev_before, prev_after)   # type: ignore[attr-defined]
    runtime.jit_cache_hook = before
    runtime.jit_post_compile_hook = after
    return True


def describe(hook_kwargs: dict) -> str:
    """``kernel(n:16, m:-, BLOCK=64, ...)``: the kernel's name, its constexpr values (an integer
    argument equal to 1 is one too) and how each other integer argument was specialised (``16``:
    a multiple of 16, ``-``: not), which is what tells one variant from another. Read from the
    hook's ``compile`` arguments (signature, constants, attributes); Triton's own repr otherwise."""
    comp = hook_kwargs.get("compile") or {}
    try:
        signature, constants, attrs = comp["signature"], comp["constants"], comp["configs"][0]
        parts = []
        for i, (arg, kind) in enumerate(signature.items()):
            if (i,) in constants:
                value = constants[(i,)]
                parts.append(f"{arg}={getattr(value, 'value', value)}")
            elif kind[:1] in ("i", "u") and kind != "u1":
                aligned = any(a and a[0] == "tt.divisibility" for a in attrs.get((i,), []))
                parts.append(f"{arg}:{'16' if aligned else '-'}")
        return f"{hook_kwargs['fn'].name}({', '.join(parts)})"
    except (AttributeError, KeyError, TypeError, IndexError):
        return str(hook_kwargs.get("repr", "?"))[:300]
