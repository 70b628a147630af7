"""Disconnects: clients that vanish at random moments are aborted and leave nothing behind, while
the streams of everyone else come out exactly as they would have alone.

Droppers are raw sockets (so the moment of the drop is ours, not a client library's): some close
right after sending (the server may not even have read the request), some as soon as the response
headers arrive (the request is in the engine, queued or in a chunked prefill: prompts of 84
tokens, a 32-token step budget), some after a few SSE events or a random delay (mid-decode: with
speculative decoding every running request holds drafts and their probabilities between steps,
so an abort always lands between a draft and its verification), some non-streaming, and a burst
of 24 drop at the same instant. Half close with a FIN, half with a RST.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import time
from dataclasses import dataclass
from typing import Optional

import httpx

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import API_KEY, start_server
from tests.server.live import metric, scrape

SEED = 77
NUM_DROPPERS = 144
NUM_BURST = 24
NUM_KEEPERS = 16
LONG_PROMPT = "def add(a, b):\n    return a + b\n" * 4  # 84 tokens: prefill takes 3 steps of 32


@dataclass
class Drop:
    mode: str      # immediately | after_headers | after_events | after_delay | non_streaming | burst
    param: float
    rst: bool
    status: Optional[int] = None  # the HTTP status, if the response started before the drop
    saw_events: int = 0


def _request_bytes(port: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {API_KEY}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n")
    return head.encode() + payload


async def _drop_one(port: int, drop: Drop, body: dict, burst: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(_request_bytes(port, body))
    await writer.drain()
    try:
        if drop.mode in ("after_headers", "after_events"):
            drop.status = int((await asyncio.wait_for(reader.readline(), 30)).split()[1])
            while (await asyncio.wait_for(reader.readline(), 30)) not in (b"\r\n", b""):
                pass  # the headers
            while drop.mode == "after_events" and drop.saw_events < drop.param:
                line = await asyncio.wait_for(reader.readline(), 30)
                if not line:
                    break
                drop.saw_events += line.startswith(b"data: ")
        elif drop.mode in ("after_delay", "non_streaming"):
            await asyncio.sleep(drop.param)
        elif drop.mode == "burst":
            await burst.wait()
    finally:
        if drop.rst:  # an abortive close: the server sees a reset, not an orderly FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.close()


def _plan(rng: random.Random) -> list[tuple[Drop, dict]]:
    plan = []
    modes = ["immediately", "after_headers", "after_events", "after_delay", "non_streaming"]
    for i in range(NUM_DROPPERS):
        mode = "burst" if i < NUM_BURST else modes[i % len(modes)]
        param = {"after_events": rng.randint(1, 6), "after_delay": rng.uniform(0.0, 1.5),
                 "non_streaming": rng.uniform(0.05, 1.5)}.get(mode, 0.0)
        prompt = LONG_PROMPT if mode == "after_headers" or rng.random() < 0.3 else f"class P{i}:"
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 150, "ignore_eos": True,
                "temperature": rng.choice([0.0, 0.8]), "seed": i, "stream": mode != "non_streaming",
                "n": rng.choice([1, 1, 2])}
        plan.append((Drop(mode, param, rst=rng.random() < 0.5), body))
    return plan


def _keeper_bodies() -> list[dict]:
    return [{"model": "tiny", "prompt": f"for i in range({i}):", "max_tokens": 24, "ignore_eos": True,
             "temperature": 0.0 if i % 2 else 0.9, "seed": 1000 + i, "stream": i % 4 != 0,
             "return_token_ids": True} for i in range(NUM_KEEPERS)]


async def _watch(url: str, headers: dict, stop: asyncio.Event, seen: dict) -> None:
    """Sample /debug/state while clients drop: drafts and blocks really were held."""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as c:
        while not stop.is_set():
            s = (await c.get("/debug/state")).json()
            seen["max_draft_prob_bytes"] = max(seen.get("max_draft_prob_bytes", 0), s["draft_prob_bytes"])
            seen["max_unfinished"] = max(seen.get("max_unfinished", 0), s["num_unfinished_requests"])
            await asyncio.sleep(0.05)


async def _scenario(srv, plan: list[tuple[Drop, dict]], seen: dict) -> list[Outcome]:
    burst, stop = asyncio.Event(), asyncio.Event()
    watcher = asyncio.create_task(_watch(srv.url, srv.headers, stop, seen))
    async with httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=120) as client:
        keepers = [asyncio.create_task(run_request(client, "/v1/completions", b)) for b in _keeper_bodies()]
        droppers = [asyncio.create_task(_drop_one(srv.port, d, b, burst)) for d, b in plan]
        await asyncio.sleep(1.0)  # the burst drops together, mid-decode
        burst.set()
        await asyncio.gather(*droppers)
        outcomes = await asyncio.gather(*keepers)
    stop.set()
    await watcher
    return outcomes


async def _alone(url: str, headers: dict) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        return [await run_request(client, "/v1/completions", {**b, "stream": False}) for b in _keeper_bodies()]


def test_dropped_clients_are_aborted_and_others_undisturbed(pair, ledger) -> None:
    plan = _plan(random.Random(SEED))
    seen: dict = {}
    with start_server(pair, "--block-size", "8", "--num-kv-blocks", "96", "--max-num-batched-tokens", "32",
                      "--max-num-seqs", "64") as srv:
        before = scrape(srv.url)
        t0 = time.monotonic()
        outcomes = asyncio.run(_scenario(srv, plan, seen))
        state = srv.wait_idle(timeout=15)
        idle_after = time.monotonic() - t0
        after = scrape(srv.url)
        alone = asyncio.run(_alone(srv.url, srv.headers))
        final = srv.wait_idle()

    def grew(reason: str) -> float:
        name = "specserve:request_success_total"
        return metric(after, name, finished_reason=reason) - metric(before, name, finished_reason=reason)

    sequences = sum(b["n"] for _, b in plan)
    # a client that closes right after sending may be gone before the server reads its request
    surely_admitted = sum(b["n"] for d, b in plan if d.mode != "immediately")
    aborted, errors = grew("abort"), grew("error")
    finished_first = grew("length") - NUM_KEEPERS  # droppers whose answer was complete before the drop
    disturbed = [i for i, (o, a) in enumerate(zip(outcomes, alone)) if o.signature() != a.signature()
                 or o.error is not None or o.status != 200]
    ledger.add("disconnects", "clients dropped", len(plan))
    for mode in ("immediately", "after_headers", "after_events", "after_delay", "non_streaming", "burst"):
        ledger.add("disconnects", f"dropped {mode.replace('_', ' ')}", sum(d.mode == mode for d, _ in plan))
    ledger.add("disconnects", "closed with RST", sum(d.rst for d, _ in plan))
    ledger.add("disconnects", "sequences aborted", f"{int(aborted)}/{sequences}")
    ledger.add("disconnects", "complete before the drop", int(finished_first))
    ledger.add("disconnects", "other streams undisturbed", f"{NUM_KEEPERS - len(disturbed)}/{NUM_KEEPERS}")
    ledger.add("disconnects", "max draft prob bytes while dropping", seen.get("max_draft_prob_bytes", 0))
    ledger.add("disconnects", "left behind", f"{state['num_total_blocks'] - state['num_free_blocks']} blocks, "
                                             f"{state['draft_prob_bytes']} draft bytes")

    assert not disturbed, f"keepers {disturbed} differ from their one-at-a-time answers"
    assert all(c.finish_reason == "length" for o in outcomes for c in o.choices.values())
    assert all(d.status in (None, 200) for d, _ in plan), [d.status for d, _ in plan]
    assert surely_admitted <= aborted + finished_first <= sequences, (aborted, finished_first, sequences)
    assert errors == 0 and grew("stop") == 0
    assert seen["max_draft_prob_bytes"] > 0, "no drafts were held while clients dropped"
    for s in (state, final):
        assert s["num_unfinished_requests"] == 0 and s["num_streams"] == 0, s
        assert s["num_free_blocks"] == s["num_total_blocks"] and s["draft_prob_bytes"] == 0, s
    assert idle_after < 60
