"""Shutdown: SIGTERM with streams in flight lets every one of them finish, refuses new requests
at once, and the process exits 0 well within --shutdown-timeout.

(That the drain is *bounded* by --shutdown-timeout is tests/server/test_cli.py's subject.)
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import start_server
from tests.helpers.server_process import ServerProcess

IN_FLIGHT = 10
MAX_TOKENS = 150
SHUTDOWN_TIMEOUT = 60
REFUSE_WITHIN = 2.0


def _body(i: int) -> tuple[str, dict]:
    stream = i % 5 != 4  # 8 streamed, 2 not
    if i % 2:
        return "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": f"n{i}"}],
                                        "max_completion_tokens": MAX_TOKENS, "ignore_eos": True,
                                        "stream": stream, "return_token_ids": True}
    return "/v1/completions", {"model": "tiny", "prompt": f"x = {i}", "max_tokens": MAX_TOKENS,
                               "ignore_eos": True, "stream": stream, "temperature": 0.0,
                               "return_token_ids": True}


async def _attempt_new(url: str, headers: dict) -> tuple[float, int, int]:
    """After SIGTERM: (seconds to the first refusal, refusals, acceptances after the first refusal)."""
    t0 = time.monotonic()
    first, refused, accepted_late = None, 0, 0
    body = {"model": "tiny", "prompt": "late", "max_tokens": 2}
    while time.monotonic() - t0 < REFUSE_WITHIN + 1.0:
        try:
            async with httpx.AsyncClient(timeout=5) as c:  # a fresh connection every time
                r = await c.post(url + "/v1/completions", json=body, headers=headers)
            ok = r.status_code == 200
        except httpx.TransportError:
            ok = False
        if not ok:
            refused += 1
            first = first if first is not None else time.monotonic() - t0
        elif first is not None:
            accepted_late += 1
        await asyncio.sleep(0.05)
    return (first if first is not None else float("inf")), refused, accepted_late


async def _scenario(srv: ServerProcess) -> tuple[list[Outcome], tuple[float, int, int]]:
    async with httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=120) as c:
        tasks = [asyncio.create_task(run_request(c, *_body(i))) for i in range(IN_FLIGHT)]
        deadline = time.monotonic() + 30
        while (await c.get("/debug/state")).json()["num_unfinished_requests"] < IN_FLIGHT:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        srv.send(signal.SIGTERM)
        attempts = await _attempt_new(srv.url, srv.headers)
        return list(await asyncio.gather(*tasks)), attempts


def test_sigterm_lets_streams_finish_and_refuses_new_ones(pair, ledger) -> None:
    srv = start_server(pair, "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)).wait_ready()
    try:
        t0 = time.monotonic()
        outcomes, (first_refusal, refused, accepted_late) = asyncio.run(_scenario(srv))
        code = srv.wait(timeout=SHUTDOWN_TIMEOUT + 15)
        took = time.monotonic() - t0
    finally:
        logs = srv.logs()
        srv.close()
    complete = [o for i, o in enumerate(outcomes) if o.status == 200 and o.error is None
                and [(len(c.token_ids), c.finish_reason) for c in o.choices.values()] == [(MAX_TOKENS, "length")]
                and (o.done_marker or not _body(i)[1]["stream"])]
    ledger.add("shutdown", "streams in flight at SIGTERM", IN_FLIGHT)
    ledger.add("shutdown", "finished completely", len(complete))
    ledger.add("shutdown", "new requests refused", refused)
    ledger.add("shutdown", "exit status", code)
    ledger.add("shutdown", "SIGTERM to exit s", round(took, 1))

    assert len(complete) == IN_FLIGHT, [(o.status, o.error) for o in outcomes]
    assert first_refusal < REFUSE_WITHIN and accepted_late == 0
    assert code == 0, logs[-3000:]
    assert took < SHUTDOWN_TIMEOUT
