"""Engine faults, injected through the test-only ``POST /debug/fault`` (``--enable-test-hooks``).

An exception inside a step must fail every affected request with a 500-class error (an error
event then [DONE] for streams, a 500 for the others), turn /health to 503, refuse new requests
with 503, and then either end the process with a non-zero status (default: exit 4 after a 2 s
grace period, so Kubernetes restarts it) or, with --no-exit-on-engine-failure, stay up and
unhealthy until it is stopped. Never a hang: every wait here is bounded.
"""

from __future__ import annotations

import asyncio
import signal
import time

import httpx

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import start_server
from tests.helpers.server_process import ServerProcess

FAULT = "reliability-injected-fault"
EXIT_ENGINE_FAILED = 4
LONG = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 200, "ignore_eos": True, "temperature": 0.8,
        "seed": 5}
LONG_CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 200,
             "ignore_eos": True}


def _in_flight(i: int) -> tuple[str, dict]:
    return ("/v1/chat/completions", LONG_CHAT) if i % 2 else ("/v1/completions", LONG)


async def _fault_with_requests_in_flight(srv: ServerProcess, num: int) -> list[Outcome]:
    """Start ``num`` long requests (6 of 8 streamed), inject the fault once all are running."""
    async with httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=60) as c:
        tasks = [asyncio.create_task(run_request(c, path, {**body, "stream": i % 4 != 3}))
                 for i, (path, body) in enumerate(map(_in_flight, range(num)))]
        deadline = time.monotonic() + 30
        while (await c.get("/debug/state")).json()["num_unfinished_requests"] < num:
            assert time.monotonic() < deadline, "the requests never got in flight"
            await asyncio.sleep(0.02)
        r = await c.post("/debug/fault", json={"message": FAULT})
        assert r.status_code == 200, r.text
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))


def _assert_failed_cleanly(outcomes: list[Outcome]) -> None:
    for o in outcomes:
        if o.done_marker:  # streamed: 200, then an error event, then [DONE]
            assert o.status == 200
        else:
            assert o.status == 500, o.status
        assert o.error is not None and FAULT in o.error["message"], o.error
        assert o.error["type"] == "internal_server_error" and o.error["code"] == "engine_error"
        assert all(c.finish_reason is None for c in o.choices.values())  # no fake finish


def _wait_health(srv: ServerProcess, status: int, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(srv.url + "/health", timeout=5)
        if r.status_code == status or time.monotonic() > deadline:
            return r
        time.sleep(0.05)


def test_fault_fails_requests_then_the_process_exits_non_zero(pair, ledger) -> None:
    srv = start_server(pair, "--enable-test-hooks").wait_ready()
    try:
        assert httpx.post(srv.url + "/debug/fault", json={"message": FAULT}).status_code == 401
        t0 = time.monotonic()
        outcomes = asyncio.run(_fault_with_requests_in_flight(srv, 8))
        failed_after = time.monotonic() - t0
        health = _wait_health(srv, 503, 1.0)
        refused = httpx.post(srv.url + "/v1/completions", json={**LONG, "max_tokens": 2}, headers=srv.headers,
                             timeout=5)
        t_fault = time.monotonic()
        code = srv.wait(timeout=30)
        exit_after = time.monotonic() - t_fault
    finally:
        logs = srv.logs()
        srv.close()
    ledger.add("engine faults", "faults injected", 1)
    ledger.add("engine faults", "in-flight requests failed with 500/error event", len(outcomes))
    ledger.add("engine faults", "exit status", code)
    ledger.add("engine faults", "exit after s", round(exit_after, 1))

    _assert_failed_cleanly(outcomes)
    assert failed_after < 30
    assert health.status_code == 503 and FAULT in health.json()["error"]["message"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_unavailable"
    assert int(refused.headers["retry-after"]) >= 1
    assert code == EXIT_ENGINE_FAILED, logs[-3000:]
    assert exit_after < 15
    assert "the engine failed" in logs and FAULT in logs


def test_fault_without_exit_stays_unhealthy_and_stops_on_sigterm(pair, ledger) -> None:
    with start_server(pair, "--enable-test-hooks", "--no-exit-on-engine-failure") as srv:
        outcomes = asyncio.run(_fault_with_requests_in_flight(srv, 4))
        time.sleep(3.0)  # longer than the exit grace period
        assert srv.proc.poll() is None, "the process exited although --no-exit-on-engine-failure"
        health = httpx.get(srv.url + "/health", timeout=5)
        state = srv.state()
        again = httpx.post(srv.url + "/debug/fault", json={"message": FAULT}, headers=srv.headers, timeout=5)
        t0 = time.monotonic()
        refused = httpx.post(srv.url + "/v1/chat/completions", json={**LONG_CHAT, "stream": True},
                             headers=srv.headers, timeout=5)
        refusal_seconds = time.monotonic() - t0
        srv.send(signal.SIGTERM)
        code = srv.wait(timeout=30)
    ledger.add("engine faults", "faults injected", 1)
    ledger.add("engine faults", "in-flight requests failed with 500/error event", len(outcomes))
    _assert_failed_cleanly(outcomes)
    assert health.status_code == 503 and state["engine_dead"] and FAULT in state["dead_error"]
    assert state["num_unfinished_requests"] == 0 and state["num_free_blocks"] == state["num_total_blocks"]
    assert state["draft_prob_bytes"] == 0, state  # fail_all() refreshes the counters (issue 16)
    assert again.status_code == 503
    assert refused.status_code == 503 and refusal_seconds < 1.0
    assert code == 0
