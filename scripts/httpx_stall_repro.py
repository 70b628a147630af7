"""The serve section's slow levels without specserve: the bench's two load clients (httpx and the
raw asyncio one, bench/serve_load.py) against a bare asyncio HTTP/1.1 server that answers each
POST after 0.2-0.4 s with a small JSON body, keep-alive, no framework. Levels of 256 requests at
concurrency 64, alternating clients; prints, per client, the levels with requests over
``--slow`` seconds, those requests and the slowest. If httpx stalls here too, the stalls are the
client's, not uvicorn's or the engine's. ``--trace``: then up to 10 more httpx levels with
httpcore's trace hook on every request, printing the slowest slow request's events (seconds from
the request's start). Time before the first event is spent before httpcore writes the request:
in httpx, the connection pool or the event loop (the server thread here shares the GIL).

    PYTHONPATH=. python3 scripts/httpx_stall_repro.py [--levels 15] [--concurrency 64] [--trace]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading

import time

import httpx

from specserve.bench.serve_load import _drive, tcp_counters

BODY = json.dumps({"choices": [{"token_ids": list(range(64))}], "usage": {"completion_tokens": 64}}).encode()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                           if h.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            await asyncio.sleep(random.uniform(0.2, 0.4))
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def start_server() -> int:
    """The bare server on its own thread and loop; its port."""
    ready: list[int] = []
    started = threading.Event()

    async def serve() -> None:
        server = await asyncio.start_server(_answer, "127.0.0.1", 0, backlog=2048)
        ready.append(server.sockets[0].getsockname()[1])
        started.set()
        async with server:
            await server.serve_forever()

    threading.Thread(target=lambda: asyncio.run(serve()), daemon=True).start()
    started.wait(10)
    return ready[0]


async def _traced_level(url: str, concurrency: int, requests: int) -> list[tuple[float, list]]:
    """One httpx level like the bench's (a semaphore over gathered requests, a pool of
    concurrency + 4): each request's seconds and its httpcore trace events."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        sem = asyncio.Semaphore(concurrency)
        out: list[tuple[float, list]] = []

        async def one() -> None:
            async with sem:
                events: list[tuple[str, float]] = []
                t0 = time.perf_counter()

                async def trace(name: str, info: dict) -> None:
                    events.append((name, round(time.perf_counter() - t0, 3)))

                await client.post(url + "/v1/completions", json={"prompt": [1]}, extensions={"trace": trace})
                out.append((time.perf_counter() - t0, events))

        await asyncio.gather(*(one() for _ in range(requests)))
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levels", type=int, default=15, help="levels per client")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--requests", type=int, default=256, help="requests per level")
    p.add_argument("--slow", type=float, default=0.9, help="seconds that make a request slow")
    p.add_argument("--trace", action="store_true", help="print where the slowest httpx request waited")
    a = p.parse_args()
    url = f"http://127.0.0.1:{start_server()}"
    tally = {c: {"levels": 0, "requests": 0, "worst": 0.0, "probes": 0} for c in ("httpx", "raw")}
    for _ in range(a.levels):
        for client, t in tally.items():
            before = tcp_counters() or {}
            records, _, _ = asyncio.run(_drive(url, "m", [[1, 2, 3]] * a.requests, 64, a.concurrency,
                                               60.0, stream=False, client_kind=client))
            after = tcp_counters() or {}
            latencies = [r.end - r.start for r in records if r.error is None]
            slow = sum(1 for x in latencies if x > a.slow)
            t["levels"] += slow > 0
            t["requests"] += slow
            t["worst"] = max(t["worst"], max(latencies, default=0.0))
            t["probes"] += after.get("TCPLossProbes", 0) - before.get("TCPLossProbes", 0)
    for client, t in tally.items():
        print(f"{client}: {t['levels']} of {a.levels} levels with requests over {a.slow:g} s, "
              f"{t['requests']} such requests, slowest {t['worst']:.2f} s, {t['probes']} TCP loss probes")
    for _ in range(10 if a.trace else 0):
        slow = [r for r in asyncio.run(_traced_level(url, a.concurrency, a.requests)) if r[0] > a.slow]
        if slow:
            seconds, events = max(slow)
            print(f"slowest traced httpx request: {seconds:.2f} s; httpcore events (s from its start): "
                  + ", ".join(f"{name} {t:g}" for name, t in events))
            break
    else:
        if a.trace:
            print(f"no traced httpx request took over {a.slow:g} s in 10 levels")


if __name__ == "__main__":
    main()
