"""Overload: beyond --max-waiting-requests new requests get 503 + Retry-After at once, while the
admitted ones finish completely and in bounded time.

4 running + 8 waiting slots; a burst of 64 requests of 48 tokens, and for 3 s after it 16 clients
that re-send as soon as they get an answer. Bounds (stated, generous for a shared 2-core
machine): every 503 within 1 s; every admitted request within 3 x the time 12 of them take when
run alone, plus 2 s.
"""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import MAX_RUNNING, MAX_WAITING
from tests.helpers.server_process import ServerProcess

BURST = 64
HAMMERS = 16
HAMMER_SECONDS = 3.0
REFUSAL_SECONDS = 1.0
BODY = {"model": "tiny", "prompt": "import os", "max_tokens": 48, "ignore_eos": True, "temperature": 0.0}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "import os"}], "max_completion_tokens": 48,
        "ignore_eos": True, "temperature": 0.0}


def _kind(i: int) -> tuple[str, dict]:
    """Request i of a mix: completions or chat, streamed or not."""
    path, body = ("/v1/chat/completions", CHAT) if i % 4 >= 2 else ("/v1/completions", BODY)
    return path, {**body, "stream": i % 2 == 0}


async def _burst(url: str, headers: dict) -> tuple[list[Outcome], list[Outcome]]:
    limits = httpx.Limits(max_connections=BURST + HAMMERS)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120, limits=limits) as client:
        burst = await asyncio.gather(*(run_request(client, *_kind(i)) for i in range(BURST)))
        deadline = time.monotonic() + HAMMER_SECONDS

        async def hammer(i: int) -> list[Outcome]:
            got: list[Outcome] = []
            while time.monotonic() < deadline:
                got.append(await run_request(client, *_kind(i + len(got))))
                await asyncio.sleep(0.02)
            return got

        hammered = [o for h in await asyncio.gather(*(hammer(i) for i in range(HAMMERS))) for o in h]
    return list(burst), hammered


async def _queue_alone(url: str, headers: dict) -> float:
    """Seconds that MAX_RUNNING + MAX_WAITING requests take with no one else around."""
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as client:
        t0 = time.monotonic()
        await asyncio.gather(*(run_request(client, "/v1/completions", BODY)
                               for _ in range(MAX_RUNNING + MAX_WAITING)))
        return time.monotonic() - t0


def test_overload_is_refused_fast_and_admitted_requests_finish(queue_srv: ServerProcess, ledger) -> None:
    srv = queue_srv
    alone = asyncio.run(_queue_alone(srv.url, srv.headers))
    burst, hammered = asyncio.run(_burst(srv.url, srv.headers))
    state = srv.wait_idle()
    health = httpx.get(srv.url + "/health", timeout=10).status_code

    everything = burst + hammered
    refused = [o for o in everything if o.status == 503]
    served = [o for o in everything if o.status == 200]
    bad_refusals = [o for o in refused if (o.error or {}).get("code") != "queue_full"
                    or not (o.retry_after or "").isdigit() or int(o.retry_after) < 1]
    incomplete = [o for o in served if o.error or [c.finish_reason for c in o.choices.values()] != ["length"]]
    latency_bound = 3 * alone + 2.0
    ledger.add("overload", "requests sent", len(everything))
    ledger.add("overload", "refused 503", len(refused))
    ledger.add("overload", "admitted and completed", len(served) - len(incomplete))
    ledger.add("overload", "slowest 503 s", round(max(o.seconds for o in refused), 3))
    ledger.add("overload", "slowest admitted s", round(max(o.seconds for o in served), 2))
    ledger.add("overload", "admitted bound s", round(latency_bound, 2))

    assert len(served) + len(refused) == len(everything), sorted({o.status for o in everything})
    # admission counts requests not yet running, so a burst that arrives between steps gets 8 in
    assert len(served) >= 2 * MAX_WAITING and len(refused) >= BURST - MAX_RUNNING - MAX_WAITING
    assert {i % 4 for i, o in enumerate(burst) if o.status == 503} == {0, 1, 2, 3}  # both APIs, both modes
    assert not bad_refusals and not incomplete
    assert max(o.seconds for o in refused) < REFUSAL_SECONDS
    assert max(o.seconds for o in served) < latency_bound
    assert health == 200 and state["num_free_blocks"] == state["num_total_blocks"], state
