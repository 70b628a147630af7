"""Chat templates sent by clients (``chat_template``, ``chat_template_kwargs.chat_template``).

They are refused unless the server runs with ``--trust-request-chat-template``. Even then a
template is code written by the client, so each render runs

* in a **child process** (``python -m specserve.server.template_sandbox``: a fresh interpreter
  holding only jinja2 and this module, never the model, the engine thread or the event loop).
  A runaway loop cannot be stopped from inside a thread (Python has no safe way to kill one, and
  a thread running Jinja competes for the GIL with the event loop), but a process can always be
  stopped: the child arms a ``SIGALRM`` timer for ``timeout`` and answers "timeout" itself; if it
  is stuck inside one long C call, the parent kills it (``timeout`` + a start-up allowance). The
  child also sets an address-space limit (``RLIMIT_AS``) and a CPU-time limit on itself, so a
  memory blow-up dies there and never grows the server's resident set;
* in Jinja's **immutable sandbox** (no attribute escapes, no mutation of lists and dicts), with
  ``*``, ``**`` and ``+`` intercepted so that ``'x' * 10**9`` or ``9 ** 10**9`` fail at once with
  a clear message instead of merely hitting the memory limit;
* with the **output counted while it is produced** (``Template.generate``): the render stops as
  soon as the text passes ``max_chars``.

The costs: an interpreter start per render (~0.1 s of CPU; the feature is opt-in and meant for
trusted clients) and at most ``MAX_CONCURRENT_RENDERS`` renders at a time (callers wait for a
slot). A plain ``multiprocessing`` child was not used: its start-up re-imports the server's main
module, and forking the server itself (threads, torch) is not safe.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Optional

MAX_CONCURRENT_RENDERS = 2
_MAX_EXPONENT = 4096
_ERROR_CHARS = 400

_START_SECONDS = 3.0   # allowance for the child interpreter's start, on top of the render's time
_slots = threading.BoundedSemaphore(MAX_CONCURRENT_RENDERS)


@dataclass(frozen=True)
class RenderLimits:
    max_chars: int              # the rendered text may not be longer
    timeout: float              # seconds of wall time for one render (the child is then killed)
    memory_bytes: int = 256 * 2**20   # address space the child may add to what it starts with


class TemplateRenderError(Exception):
    """The template could not be rendered within the limits; ``reason`` is one of
    ``invalid`` (syntax or runtime error), ``too_large``, ``timeout``, ``memory``."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


# ------------------------------------------------------------------------------ in the child

class _TooLarge(Exception):
    pass


def _environment(max_chars: int) -> Any:
    from jinja2.exceptions import SecurityError, TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def _sized(value: Any) -> Optional[int]:
        return len(value) if isinstance(value, (str, bytes, list, tuple)) else None

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > _MAX_EXPONENT:
                raise SecurityError(f"exponent {right} is too large (at most {_MAX_EXPONENT})")
            if operator == "*":
                for seq, count in ((left, right), (right, left)):
                    size = _sized(seq)
                    if size is not None and isinstance(count, int) and size * count > max_chars:
                        raise _TooLarge(f"a repetition of {size} x {count} items")
            if operator == "+":
                a, b = _sized(left), _sized(right)
                if a is not None and b is not None and a + b > max_chars:
                    raise _TooLarge(f"a concatenation of {a} + {b} items")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: Any, indent: Optional[int] = None, ensure_ascii: bool = False,
               sort_keys: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render_limited(source: str, variables: dict[str, Any], max_chars: int) -> str:
    """Render ``source`` in the limited sandbox, stopping as soon as the output passes ``max_chars``."""
    template = _environment(max_chars).from_string(source)
    pieces, size = [], 0
    for piece in template.generate(**variables):
        size += len(piece)
        if size > max_chars:
            raise _TooLarge(f"more than {max_chars} characters of output")
        pieces.append(piece)
    return "".join(pieces)


def _vm_size() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _OutOfTime(Exception):
    pass


def _on_alarm(*_: Any) -> None:
    raise _OutOfTime()


def _render_job(job: dict[str, Any]) -> tuple[str, str]:
    """(status, text or message) for one job; runs in the child, under its own limits."""
    timeout = float(job["timeout"])
    try:
        base = _vm_size()
        if base:
            limit = base + int(job["memory_bytes"])
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(timeout) + 2
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout)
        return "ok", render_limited(job["source"], job["variables"], int(job["max_chars"]))
    except _OutOfTime:
        return "timeout", f"the template did not finish rendering within {timeout:g} s"
    except _TooLarge as e:
        return "too_large", f"the template's output is too large: {e}"
    except MemoryError:
        return "memory", "the template needed more memory than a render may use"
    except RecursionError:
        return "invalid", "the template recursed too deeply"
    except Exception as e:  # noqa: BLE001 - whatever the template raised is reported to the client
        return "invalid", f"{type(e).__name__}: {e}"[:_ERROR_CHARS]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main() -> None:
    """The child: one JSON job on stdin, one JSON ``[status, payload]`` on stdout."""
    result = _render_job(json.loads(sys.stdin.buffer.read()))
    sys.stdout.write(json.dumps(result))
    sys.stdout.flush()


# ----------------------------------------------------------------------------- in the server

def warm_up() -> None:
    """Render once so the interpreter's files are in the page cache before the first request."""
    render_blocking("{{ x }}", {"x": "ok"}, RenderLimits(max_chars=16, timeout=30.0))


def render_blocking(source: str, variables: dict[str, Any], limits: RenderLimits) -> str:
    """Render in a child process; blocks the calling (worker) thread for at most ~``timeout`` s
    once a render slot is free. Raises TemplateRenderError."""
    job = json.dumps({"source": source, "variables": variables, "max_chars": limits.max_chars,
                      "timeout": limits.timeout, "memory_bytes": limits.memory_bytes}).encode("utf-8")
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "PYTHONPATH", "VIRTUAL_ENV", "LANG")}
    with _slots:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(job, timeout=limits.timeout + _START_SECONDS)
        except subprocess.TimeoutExpired:
            raise TemplateRenderError("timeout", f"the template did not finish rendering within "
                                                 f"{limits.timeout:g} s") from None
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    try:
        status, payload = json.loads(out)
    except ValueError:  # killed by its own limits before it could answer
        raise TemplateRenderError("memory", "the template's render was stopped by its memory or CPU "
                                            "limit") from None
    if status != "ok":
        raise TemplateRenderError(status, payload)
    return payload


def continue_final_message(rendered: str, messages: list[dict[str, Any]]) -> str:
    """Cut the rendered prompt right after the last message's content (so the model continues it)."""
    final = str(messages[-1].get("content") or "").strip() if messages else ""
    if not final:
        return rendered
    at = rendered.rfind(final)
    if at < 0:
        raise TemplateRenderError("invalid", "continue_final_message: the template's output does not "
                                             "contain the final message's content")
    return rendered[: at + len(final)]


if __name__ == "__main__":
    main()
