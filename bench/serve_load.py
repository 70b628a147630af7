"""Throughput under load through the HTTP server, in the style of ``vllm bench serve``.

A real ``specserve serve`` runs as a child process on a free 127.0.0.1 port. Each concurrency
level sends a bounded number of streaming /v1/completions requests (token-id prompts, greedy,
``ignore_eos``, ``return_token_ids`` so every SSE chunk says how many tokens it carries) with at
most ``concurrency`` in flight. Per request: TTFT (send -> first chunk with tokens), ITL (gaps
between chunks), TPOT ((last - first chunk) / (tokens - 1)), E2E. Speculative-decoding acceptance
comes from /metrics scraped before and after each level: acceptance rate = accepted / draft
tokens, acceptance length = 1 + accepted / drafts, per position = accepted_per_pos[i] / drafts.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from typing import AsyncIterator, Callable, Optional, Sequence

import httpx

from specserve.bench.timing import percentile

_SPEC = "specserve:spec_decode_"
PERCENTILES = (50, 90, 99)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """``python -m server.cli serve ARGV --host 127.0.0.1 --port P`` as a child process."""

    def __init__(self, argv: Sequence[str], log_path: Path, cwd: Path,
                 extra_env: Optional[dict[str, str]] = None, log_level: str = "warning"):
        """``log_level``: the server's; at info or debug its stats line comes every second."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, "-m", "specserve.server.cli", "serve", *argv, "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", log_level, "--no-access-log"]
        if log_level in ("info", "debug"):
            cmd += ["--log-stats-interval", "1"]
        self.command = cmd
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **(extra_env or {})}
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=str(cwd), env=env, stdout=self._log,
                                     stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float) -> str:
        """Poll /health until it answers; return the served model name."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2.0).status_code == 200:
                    models = httpx.get(self.url + "/v1/models", timeout=5.0).json()
                    return models["data"][0]["id"]
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise RuntimeError(f"the server did not become healthy in {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return text[-n:]

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---- /metrics ------------------------------------------------------------------------------
@dataclass
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: dict[int, float] = field(default_factory=dict)
    generation_tokens: float = 0.0
    # the server's own e2e latency histogram (arrival in the engine to finish): cumulative
    # count at or under each bucket bound, seconds (+inf: every finished request)
    e2e_le: dict[float, float] = field(default_factory=dict)
    # and its HTTP side's (/v1/completions: the app's first sight of a request to its last byte)
    http_le: dict[float, float] = field(default_factory=dict)

    def minus(self, other: "SpecCounters") -> "SpecCounters":
        return SpecCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                            self.accepted - other.accepted,
                            {p: v - other.per_pos.get(p, 0.0) for p, v in self.per_pos.items()},
                            self.generation_tokens - other.generation_tokens,
                            {b: v - other.e2e_le.get(b, 0.0) for b, v in self.e2e_le.items()},
                            {b: v - other.http_le.get(b, 0.0) for b, v in self.http_le.items()})

    def server_e2e_over(self, seconds: float) -> Optional[float]:
        """Requests whose server-side e2e exceeded ``seconds`` (a bucket bound), if scraped."""
        return _over(self.e2e_le, seconds)

    def server_http_over(self, seconds: float) -> Optional[float]:
        """Requests whose server-side HTTP time exceeded ``seconds`` (a bucket bound), if scraped."""
        return _over(self.http_le, seconds)

    def summary(self) -> dict:
        d = self.drafts
        return {"num_drafts": self.drafts, "num_draft_tokens": self.draft_tokens,
                "num_accepted_tokens": self.accepted, "generation_tokens": self.generation_tokens,
                "acceptance_rate": self.accepted / self.draft_tokens if self.draft_tokens else None,
                "acceptance_length": 1 + self.accepted / d if d else None,
                "per_position_acceptance": [self.per_pos[p] / d for p in sorted(self.per_pos)] if d else []}


def _over(le: dict[float, float], seconds: float) -> Optional[float]:
    """Observations over ``seconds`` in a cumulative histogram (None if it has no such bound)."""
    if seconds not in le or math.inf not in le:
        return None
    return le[math.inf] - le[seconds]


def scrape_spec_counters(url: str) -> SpecCounters:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10.0).text
    c = SpecCounters()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == _SPEC + "num_drafts_total":
                c.drafts += s.value
            elif s.name == _SPEC + "num_draft_tokens_total":
                c.draft_tokens += s.value
            elif s.name == _SPEC + "num_accepted_tokens_total":
                c.accepted += s.value
            elif s.name == _SPEC + "num_accepted_tokens_per_pos_total":
                pos = int(s.labels["position"])
                c.per_pos[pos] = c.per_pos.get(pos, 0.0) + s.value
            elif s.name == "specserve:generation_tokens_total":
                c.generation_tokens += s.value
            elif s.name == "specserve:e2e_request_latency_seconds_bucket":
                bound = float(s.labels["le"])
                c.e2e_le[bound] = c.e2e_le.get(bound, 0.0) + s.value
            elif (s.name == "specserve:http_request_duration_seconds_bucket"
                  and s.labels.get("handler") == "/v1/completions"):
                bound = float(s.labels["le"])
                c.http_le[bound] = c.http_le.get(bound, 0.0) + s.value
    return c


# ---- load ----------------------------------------------------------------------------------
@dataclass
class RequestRecord:
    start: float
    end: float = 0.0
    chunks: list[tuple[float, int]] = field(default_factory=list)   # (arrival time, tokens)
    completion_tokens: Optional[int] = None
    error: Optional[str] = None

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


async def _one_request(client: httpx.AsyncClient, url: str, body: dict) -> RequestRecord:
    if not body["stream"]:
        return await _one_body(client, url, body)
    rec = RequestRecord(time.perf_counter())
    try:
        async with client.stream("POST", url + "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}"
                return rec
            async for line in resp.aiter_lines():   # (to the stream's end: the connection is reused)
                if line.startswith("data: "):
                    _take_event(line[6:], rec)
    except Exception as e:  # noqa: BLE001 - any failure is this request's, not the level's
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end = time.perf_counter()
    return rec


async def _one_body(client: httpx.AsyncClient, url: str, body: dict) -> RequestRecord:
    """A request answered in one JSON body: its tokens arrive together, as one chunk."""
    rec = RequestRecord(time.perf_counter())
    try:
        resp = await client.post(url + "/v1/completions", json=body)
        if resp.status_code != 200:
            rec.error = f"HTTP {resp.status_code}: {resp.text[:300]!r}"
            return rec
        _take_body(resp.json(), rec)
    except Exception as e:  # noqa: BLE001 - any failure is this request's, not the level's
        rec.error = f"{type(e).__name__}: {e}"
    finally:
        rec.end = time.perf_counter()
    return rec


async def _drive_raw(url: str, body_of: Callable[[list[int]], dict], prompts: list[list[int]],
                     concurrency: int, timeout: float) -> tuple[list[RequestRecord], float, float]:
    """Requests through ``concurrency`` workers, each with one keep-alive HTTP/1.1 connection of
    its own, written and read with asyncio streams (no HTTP library): the second client, to
    tell a client's stalls from the server's (httpx held requests for seconds before writing
    them: scripts/httpx_stall_repro.py). A request that fails (an error status, a
    broken or closed connection, a reply it cannot read, ``timeout``) is recorded as failed, and
    the worker reconnects unless the reply left the connection reusable. ``timeout`` bounds a
    whole request here, where httpx bounds each connect, read and write."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        raise ValueError(f"the raw client needs an http://host:port URL, not {url!r}")
    host, port = parts.hostname, parts.port
    pending = list(enumerate(prompts))[::-1]
    records: list[RequestRecord] = [RequestRecord(0.0, error="not sent") for _ in prompts]

    async def worker() -> None:
        conn: Optional[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = None
        while pending:
            i, prompt = pending.pop()
            rec = records[i] = RequestRecord(time.perf_counter())
            keep = False
            try:
                if conn is None:
                    conn = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
                keep = await asyncio.wait_for(_raw_request(conn[0], conn[1], host, body_of(prompt), rec), timeout)
            except Exception as e:  # noqa: BLE001 - any failure is this request's, not the level's
                rec.error = f"{type(e).__name__}: {e}"
            finally:
                rec.end = time.perf_counter()
            if not keep and conn is not None:
                conn[1].close()
                conn = None
        if conn is not None:
            conn[1].close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return records, time.perf_counter() - t0, t0


async def _raw_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str,
                       body: dict, rec: RequestRecord) -> bool:
    """One POST /v1/completions on an open connection, filling ``rec`` as the httpx path does (a
    stream: one chunk per SSE event with tokens, timed on arrival; a body: one chunk); whether
    the connection can carry the next request (its reply was read whole and did not say
    Connection: close). Raises on a reply it cannot read."""
    data = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: " + host.encode() + b"\r\n"
                 b"Content-Type: application/json\r\nContent-Length: " + str(len(data)).encode()
                 + b"\r\n\r\n" + data)
    await writer.drain()
    lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
    keep = headers.get("connection", "").lower() != "close"
    chunked = headers.get("transfer-encoding", "").lower() == "chunked"
    if chunked and status == 200 and body.get("stream"):
        pending = b""
        async for piece in _chunks(reader):
            now = time.perf_counter()
            *events, pending = (pending + piece).replace(b"\r\n", b"\n").split(b"\n\n")
            for event in events:
                _read_event(event, now, rec)
        if pending.strip():   # a last event without its blank line
            _read_event(pending, time.perf_counter(), rec)
        return keep
    if chunked:
        payload = b"".join([piece async for piece in _chunks(reader)])
    elif "content-length" in headers:
        payload = await reader.readexactly(int(headers["content-length"]))
    else:
        raise ValueError(f"HTTP {status} reply with neither Content-Length nor chunks")
    if status != 200:
        rec.error = f"HTTP {status}: {payload[:300]!r}"
        return keep
    _take_body(json.loads(payload), rec)
    return keep


async def _chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The pieces of a chunked HTTP/1.1 body, each as it arrives (trailers skipped)."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass
            return
        piece = await reader.readexactly(size)
        await reader.readexactly(2)
        yield piece


def _read_event(event: bytes, now: float, rec: RequestRecord) -> None:
    """One SSE event of a completion stream (its lines) into ``rec``, tokens timed at ``now``."""
    for line in event.split(b"\n"):
        if line.startswith(b"data: "):
            _take_event(line[6:], rec, now)


def _take_event(data: str | bytes, rec: RequestRecord, now: Optional[float] = None) -> None:
    """One SSE ``data:`` payload of a completion stream, for both clients: [DONE] passes, an
    error marks the request failed, tokens become a chunk timed at ``now`` (default: as it is
    read), usage gives the completion tokens."""
    if data in ("[DONE]", b"[DONE]"):
        return
    obj = json.loads(data)
    if "error" in obj:
        rec.error = str(obj["error"])[:300]
        return
    n = _tokens(obj)
    if n:
        rec.chunks.append((time.perf_counter() if now is None else now, n))
    if obj.get("usage"):
        rec.completion_tokens = obj["usage"].get("completion_tokens")


def _take_body(obj: dict, rec: RequestRecord) -> None:
    """A completion's JSON body, for both clients: its tokens as one chunk timed now (a body
    without tokens counts as failed, as an empty stream does) and its usage."""
    n = _tokens(obj)
    if n:
        rec.chunks.append((time.perf_counter(), n))
    rec.completion_tokens = (obj.get("usage") or {}).get("completion_tokens")


def _tokens(obj: dict) -> int:
    """Tokens a completion body or chunk carries (``return_token_ids``), over its choices."""
    return sum(len(c.get("token_ids") or []) for c in obj.get("choices", []))


async def _drive(url: str, model: str, prompts: list[list[int]], output_len: int,
                 concurrency: int, timeout: float, stream: bool = True,
                 client_kind: str = "httpx") -> tuple[list[RequestRecord], float, float]:
    """(the records, the level's seconds, its start on the perf_counter clock). ``client_kind``:
    httpx (its connection pool) or raw (a connection per worker; see _drive_raw)."""
    def body_of(prompt: list[int]) -> dict:
        body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0,
                "ignore_eos": True, "stream": stream, "return_token_ids": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        return body

    if client_kind == "raw":
        return await _drive_raw(url, body_of, prompts, concurrency, timeout)
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout), limits=limits) as client:
        async def bounded(prompt: list[int]) -> RequestRecord:
            async with sem:
                return await _one_request(client, url, body_of(prompt))

        t0 = time.perf_counter()
        records = await asyncio.gather(*(bounded(p) for p in prompts))
        return list(records), time.perf_counter() - t0, t0


def _stats_ms(xs: list[float]) -> dict:
    out = {"mean": 1e3 * sum(xs) / len(xs) if xs else None}
    for q in PERCENTILES:
        v = percentile(xs, q)
        out[f"p{q}"] = None if v is None else 1e3 * v
    return out


def summarize(records: list[RequestRecord], duration: float, stream: bool = True) -> dict:
    """Throughput and latency percentiles of one level; without a stream the tokens arrive at
    the end, so TTFT, ITL and TPOT are not measured (None)."""
    ok = [r for r in records if r.error is None and r.chunks]
    timed = ok if stream else []
    ttft = [r.chunks[0][0] - r.start for r in timed]
    itl = [b[0] - a[0] for r in timed for a, b in zip(r.chunks, r.chunks[1:])]
    tpot = [(r.chunks[-1][0] - r.chunks[0][0]) / (r.num_tokens - 1) for r in timed if r.num_tokens > 1]
    e2e = [r.end - r.start for r in ok]
    tokens = sum(r.num_tokens for r in ok)
    mismatched = sum(1 for r in ok if r.completion_tokens is not None and r.completion_tokens != r.num_tokens)
    return {"num_requests": len(records), "completed": len(ok),
            "failed": len(records) - len(ok), "errors": sorted({r.error for r in records if r.error})[:3],
            "duration_s": duration, "output_tokens": tokens, "output_tok_per_s": tokens / duration,
            "request_per_s": len(ok) / duration, "usage_mismatches": mismatched,
            "ttft_ms": _stats_ms(ttft), "itl_ms": _stats_ms(itl), "tpot_ms": _stats_ms(tpot),
            "e2e_ms": _stats_ms(e2e)}


SLOW_REQUEST_S = 1.0   # a bucket bound of the server's e2e histogram (server/metrics.py)

# the host's TCP counters a level reads (Linux: /proc/net/snmp and /proc/net/netstat). They
# count the whole network namespace, client and server sides of the loopback together: a level
# that opens new connections (PassiveOpens), drops them at a full accept queue (ListenOverflows,
# ListenDrops) or resends SYNs (TCPSynRetrans, 1 s then 3 s on Linux) or segments after a timeout
# (TCPTimeouts) says so beside its latencies.
TCP_COUNTERS = {"Tcp": ("ActiveOpens", "PassiveOpens", "RetransSegs"),
                "TcpExt": ("ListenOverflows", "ListenDrops", "TCPSynRetrans", "TCPTimeouts",
                           "TCPLossProbes")}


def tcp_counters(paths: Sequence[str] = ("/proc/net/snmp", "/proc/net/netstat")) -> Optional[dict[str, int]]:
    """The TCP_COUNTERS now, or None where the files are not there (not Linux)."""
    out: dict[str, int] = {}
    try:
        for path in paths:
            lines = Path(path).read_text().splitlines()
            for names, values in zip(lines[::2], lines[1::2]):
                group, *keys = names.split()
                wanted = TCP_COUNTERS.get(group.rstrip(":"), ())
                for key, value in zip(keys, values.split()[1:]):
                    if key in wanted:
                        out[key] = int(value)
    except (OSError, ValueError):
        return None
    return out


def run_level(url: str, model: str, prompts: list[list[int]], output_len: int, concurrency: int,
              timeout: float = 600.0, stream: bool = True, client_kind: str = "httpx") -> dict:
    """One concurrency level: the load, its latency summary, the /metrics acceptance delta, the
    host's TCP counters over it (``tcp``, None off Linux) and each request's start and end,
    seconds from the level's start (``timeline``). ``stream``: SSE streams (else one JSON body
    per request)."""
    before = scrape_spec_counters(url)
    tcp_before = tcp_counters()
    records, duration, t0 = asyncio.run(_drive(url, model, prompts, output_len, concurrency, timeout, stream,
                                               client_kind))
    tcp_after = tcp_counters()
    after = scrape_spec_counters(url)
    tcp = ({k: tcp_after[k] - tcp_before.get(k, 0) for k in tcp_after}
           if tcp_before is not None and tcp_after is not None else None)
    delta = after.minus(before)
    client_e2e = [r.end - r.start for r in records if r.error is None]
    # where a slow request lost its time: inside the server's engine (its own e2e histogram),
    # around the engine inside the app (its HTTP histogram), or outside the app (the client's
    # e2e only: the sockets, uvicorn's parsing before the app sees a request, the client)
    slow = {"over_s": SLOW_REQUEST_S, "client": sum(1 for x in client_e2e if x > SLOW_REQUEST_S),
            "server": delta.server_e2e_over(SLOW_REQUEST_S), "server_finished": delta.e2e_le.get(math.inf),
            "http": delta.server_http_over(SLOW_REQUEST_S)}
    return {"concurrency": concurrency, "stream": stream, "client": client_kind,
            **summarize(records, duration, stream),
            "spec_decode": delta.summary(), "tcp": tcp, "slow_requests": slow,
            "timeline": [[round(r.start - t0, 4), round(r.end - t0, 4)] for r in records]}
