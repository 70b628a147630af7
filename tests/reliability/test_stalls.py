"""Big inputs and client chat templates must never stall the server (issue 16).

While each hostile request below is being processed, a concurrent stream keeps producing chunks
and ``/health`` keeps answering; both are measured from their own threads (so the test's own
upload of a 7.6 MB body does not distort them):

* the largest gap between two consecutive SSE chunks of a running stream that overlaps the
  hostile request's window, < 250 ms;
* the slowest ``/health`` answer started inside the window, < 250 ms;
* the server's resident set after the request minus before it, < 64 MiB per request.

The server trusts request chat templates here (``--trust-request-chat-template``, 1 s budget) so
that the template cases are rendered (and refused by their limits); ``main_srv`` (no trust) refuses
them outright (test_hostile.py). The body limit is 16 MiB so that a 7.6 MB prompt reaches the app.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import pytest

from tests.reliability.conftest import start_server
from tests.helpers.server_process import ServerProcess

MAX_GAP_S = 0.25
MAX_HEALTH_S = 0.25
RSS_PER_REQUEST_MIB = 64
BIG = "def add(a, b):\n    return a + b\n" * 240_000          # 7.68 MB of text
STREAM = {"model": "tiny", "prompt": "def f(x):", "max_tokens": 200, "ignore_eos": True, "stream": True,
          "temperature": 0.8}
CHAT = {"model": "tiny", "max_completion_tokens": 2}


def _msgs(content: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


# (id, path, body, status, error code or its prefix). Jinja folds constant expressions such as
# 9 ** 1000000 while compiling, outside the intercepted operators: that one ends by the time limit.
CASES: list[tuple[str, str, dict, int, Optional[str]]] = [
    ("7.6 MB prompt", "/v1/completions", {"model": "tiny", "prompt": BIG, "max_tokens": 2}, 400,
     "invalid_value"),
    ("7.6 MB chat message", "/v1/chat/completions", {**CHAT, "messages": _msgs(BIG)}, 400, "invalid_value"),
    ("8 prompts of 0.9 MB", "/v1/completions", {"model": "tiny", "prompt": [BIG[:900_000]] * 8,
                                                "max_tokens": 2}, 400, "invalid_value"),
    ("200 kB prompt tokenized", "/v1/completions", {"model": "tiny", "prompt": "x" * 200_000,
                                                    "max_tokens": 2}, 400, "invalid_value"),
    ("template 'def f(x): ' * 10^6", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template_kwargs": {"chat_template": "{{ 'def f(x): ' * 1000000 }}"}},
     400, "chat_template_too_large"),
    ("template nested loops", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template": "{% for a in range(100000) %}{% for b in range(100000) %}"
                                                         "{% endfor %}{% endfor %}"}, 400, "chat_template_timeout"),
    ("template doubling a string", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                                                         "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"},
     400, "chat_template_"),
    ("template output loop", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template": "{% for a in range(100000) %}{% for b in range(100) %}"
                                                         "{{ a }}{% endfor %}{% endfor %}"},
     400, "chat_template_too_large"),
    ("template 9 ** 10^6", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template": "{{ 9 ** 1000000 }}"}, 400, "chat_template_"),
    ("template escaping the sandbox", "/v1/chat/completions",
     {**CHAT, "messages": _msgs("hi"), "chat_template": "{{ ''.__class__.__mro__[1].__subclasses__() }}"},
     400, "chat_template_invalid"),
]


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


class Probe(threading.Thread):
    """Streams back to back (recording chunk times per stream) or polls /health (recording latency)."""

    def __init__(self, srv: ServerProcess, kind: str):
        super().__init__(daemon=True)
        self.srv, self.kind = srv, kind
        self.stop = threading.Event()
        self.streams: list[list[float]] = []
        self.health: list[tuple[float, float]] = []   # (start, seconds)
        self.errors: list[str] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.srv.url, headers=self.srv.headers, timeout=30) as c:
            while not self.stop.is_set():
                try:
                    self._stream(c) if self.kind == "stream" else self._health(c)
                except httpx.HTTPError as e:
                    self.errors.append(repr(e))

    def _stream(self, c: httpx.Client) -> None:
        times: list[float] = []
        self.streams.append(times)
        with c.stream("POST", "/v1/completions", json=STREAM) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    times.append(time.monotonic())
                if self.stop.is_set():
                    return

    def _health(self, c: httpx.Client) -> None:
        t0 = time.monotonic()
        r = c.get("/health")
        self.health.append((t0, time.monotonic() - t0))
        if r.status_code != 200:
            self.errors.append(f"/health {r.status_code}")
        time.sleep(0.02)

    def worst_gap(self, t0: float, t1: float) -> tuple[float, int]:
        """(largest gap between consecutive chunks overlapping [t0, t1], chunks inside the window)."""
        worst, inside = 0.0, 0
        for times in self.streams:
            for a, b in zip(times, times[1:]):
                if b >= t0 and a <= t1:
                    worst = max(worst, b - a)
            inside += sum(t0 <= t <= t1 for t in times)
        return worst, inside

    def worst_health(self, t0: float, t1: float) -> float:
        return max((s for start, s in self.health if t0 <= start <= t1), default=0.0)


@pytest.fixture(scope="module")
def srv(pair) -> Iterator[ServerProcess]:
    with start_server(pair, "--max-request-body-bytes", str(16 * 2**20), "--trust-request-chat-template",
                      "--chat-template-timeout", "1") as s:
        yield s


def test_hostile_requests_do_not_stall_streams_or_health(srv: ServerProcess, ledger) -> None:
    httpx.post(srv.url + "/v1/chat/completions", json={**CHAT, "messages": _msgs("warm up"),
               "chat_template": "{{ messages[0]['content'] }}"}, headers=srv.headers, timeout=30)
    stream, health = Probe(srv, "stream"), Probe(srv, "health")
    stream.start()
    health.start()
    rows, failures = [], []
    try:
        time.sleep(1.0)
        for name, path, body, status, code in CASES:
            raw = json.dumps(body).encode()
            rss0 = _rss_mib(srv.proc.pid)
            t0 = time.monotonic()
            r = httpx.post(srv.url + path, content=raw, timeout=60,
                           headers={**srv.headers, "Content-Type": "application/json"})
            t1 = time.monotonic()
            time.sleep(0.3)  # let the stream produce a chunk after the window
            rss = _rss_mib(srv.proc.pid) - rss0
            gap, inside = stream.worst_gap(t0, t1 + 0.3)
            slow_health = health.worst_health(t0, t1)
            error = r.json().get("error", {}) if r.status_code != 200 else {}
            rows.append((name, len(raw), r.status_code, error.get("code"), t1 - t0, gap, slow_health, rss))
            if r.status_code != status or not str(error.get("code")).startswith(code or "") or \
                    set(error) != {"message", "type", "param", "code"}:
                failures.append(f"{name}: {r.status_code} {r.text[:300]}")
            if gap >= MAX_GAP_S or slow_health >= MAX_HEALTH_S or inside == 0:
                failures.append(f"{name}: stream gap {gap:.3f}s ({inside} chunks in the window), "
                                f"/health {slow_health:.3f}s")
            if rss >= RSS_PER_REQUEST_MIB:
                failures.append(f"{name}: RSS grew {rss:.1f} MiB")
    finally:
        stream.stop.set()
        health.stop.set()
        stream.join(30)
        health.join(30)
    table = "\n".join(f"{n}: {size} B -> {st} {code} in {s:.2f}s; stream gap {g * 1000:.0f} ms, "
                      f"/health {h * 1000:.0f} ms, RSS {m:+.1f} MiB" for n, size, st, code, s, g, h, m in rows)
    print("\n" + table)
    ledger.add("stalls", "hostile requests", len(rows))
    ledger.add("stalls", "largest stream gap ms", round(max(r[5] for r in rows) * 1000))
    ledger.add("stalls", "slowest /health ms", round(max(r[6] for r in rows) * 1000))
    ledger.add("stalls", "largest RSS growth per request MiB", round(max(r[7] for r in rows), 1))
    ledger.add("stalls", "slowest refusal s", round(max(r[4] for r in rows), 2))
    assert not stream.errors and not health.errors, (stream.errors, health.errors)
    assert not failures, "\n".join(failures) + "\n" + table


def test_a_trusted_request_template_is_rendered(srv: ServerProcess) -> None:
    body = {**CHAT, "messages": _msgs("hello"), "max_completion_tokens": 4, "return_token_ids": True,
            "chat_template": "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
                             "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"}
    r = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=srv.headers, timeout=30)
    assert r.status_code == 200, r.text
    plain = httpx.post(srv.url + "/v1/chat/completions", json={k: v for k, v in body.items() if k != "chat_template"},
                       headers=srv.headers, timeout=30)
    # the same template as the model's own (tests/helpers/checkpoints.py): the same prompt
    assert r.json()["prompt_token_ids"] == plain.json()["prompt_token_ids"]
