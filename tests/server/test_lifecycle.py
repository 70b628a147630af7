"""Client disconnects abort at once; a full queue answers 503 + Retry-After; an engine failure
arrives as a stream error event and turns /health to 503."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.server.conftest import API_KEY, MODEL, server_argv
from tests.server.live import LiveServer, metric, scrape

AUTH = {"Authorization": f"Bearer {API_KEY}"}
LONG = {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 230, "temperature": 0.7, "seed": 1,
        "ignore_eos": True}


def _aborts(url: str) -> float:
    return metric(scrape(url), "specserve:request_success_total", finished_reason="abort")


def _assert_freed_soon(server: LiveServer, limit: float = 3.0) -> None:
    t0 = time.monotonic()
    state = server.wait_idle(timeout=limit)
    assert state["num_unfinished_requests"] == 0, state
    assert state["num_free_blocks"] == state["num_total_blocks"], state
    assert state["draft_prob_bytes"] == 0, state
    assert time.monotonic() - t0 < limit


def test_stream_disconnect_aborts_at_once(server) -> None:
    server.wait_idle()
    aborts = _aborts(server.url)
    body = {**LONG, "stream": True, "n": 2}
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            assert json.loads(first[6:])["choices"]
            busy = server.engine.debug_state()
            assert busy["num_unfinished_requests"] == 1 and busy["num_free_blocks"] < busy["num_total_blocks"]
        # leaving the block closes the connection mid-stream
    _assert_freed_soon(server)
    assert _aborts(server.url) - aborts == 2  # both choices


def test_non_streaming_disconnect_aborts(server) -> None:
    server.wait_idle()
    aborts = _aborts(server.url)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json={**LONG, "n": 8}, headers=AUTH, timeout=0.3)
    _assert_freed_soon(server)
    assert _aborts(server.url) - aborts == 8


@pytest.fixture()
def small_queue_server(tiny_pair):
    argv = server_argv(tiny_pair, "--served-model-name", MODEL, "--max-num-seqs", "1",
                       "--max-waiting-requests", "1")
    with LiveServer(argv) as live:
        yield live


def test_queue_full_is_503_with_retry_after(small_queue_server) -> None:
    """One running + one waiting slot: a burst of 16 long requests must see refusals, not failures."""

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=small_queue_server.url, timeout=120,
                                     limits=httpx.Limits(max_connections=16)) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=LONG) for _ in range(16)))

    responses = asyncio.run(burst())
    refused = [r for r in responses if r.status_code == 503]
    served = [r for r in responses if r.status_code == 200]
    assert len(refused) + len(served) == 16
    assert refused and served
    for r in refused:
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "queue_full"
    assert all(r.json()["usage"]["completion_tokens"] == LONG["max_tokens"] for r in served)


@pytest.fixture()
def doomed_server(tiny_pair):
    with LiveServer(server_argv(tiny_pair, "--served-model-name", MODEL)) as live:
        yield live


def test_engine_failure_mid_stream_is_an_error_event(doomed_server) -> None:
    srv = doomed_server
    assert httpx.get(srv.url + "/health").status_code == 200
    with httpx.Client(base_url=srv.url, timeout=60) as c, \
            c.stream("POST", "/v1/chat/completions",
                     json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                           "max_completion_tokens": 230, "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        srv.engine.inject_fault("injected by the test")
        events = [line[6:] for line in lines if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert set(error) == {"message", "type", "param", "code"} and "injected by the test" in error["message"]
    health = httpx.get(srv.url + "/health")
    assert health.status_code == 503 and "injected by the test" in health.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"
    assert httpx.get(srv.url + "/metrics").status_code == 200
