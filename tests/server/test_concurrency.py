"""32+ concurrent streams give the same tokens as one at a time (greedy), and /metrics adds up to
exactly what the responses' usage blocks report."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.server.conftest import API_KEY, K, MODEL
from tests.server.live import metric, scrape

NUM_STREAMS = 36
PROMPTS = ["def add(a, b):", "for i in range(10):", "class Point:", "import os", "The quick brown fox",
           "Hello, world!", "if __name__ == '__main__':", "Speculative decoding"]


def _body(i: int) -> dict:
    return {"model": MODEL, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 16 + (i % 5) * 4,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def _one_stream(client: httpx.AsyncClient, body: dict) -> tuple[list[int], dict]:
    ids: list[int] = []
    usage = None
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            for ch in chunk["choices"]:
                ids += ch["token_ids"]
            usage = chunk.get("usage", usage)
    return ids, usage


async def _all_streams(url: str, bodies: list[dict]) -> list[tuple[list[int], dict]]:
    limits = httpx.Limits(max_connections=len(bodies))
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"},
                                 timeout=120, limits=limits) as client:
        return await asyncio.gather(*(_one_stream(client, b) for b in bodies))


def test_concurrent_streams_match_sequential_and_metrics_add_up(server, http: httpx.Client) -> None:
    bodies = [_body(i) for i in range(NUM_STREAMS)]
    sequential = []
    for body in bodies:  # one at a time, not streamed
        r = http.post("/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
        sequential.append(r["choices"][0]["token_ids"])
    server.wait_idle()
    before = scrape(server.url)

    peak = {"running": 0}  # the listener stays registered: keep its state constant-size
    server.engine.add_step_listener(lambda st: peak.update(running=max(peak["running"], st.num_running)))
    results = asyncio.run(_all_streams(server.url, bodies))

    server.wait_idle()
    after = scrape(server.url)
    assert peak["running"] >= NUM_STREAMS // 2  # they really ran together
    for body, alone, (ids, usage) in zip(bodies, sequential, results, strict=True):
        assert ids == alone, body
        assert len(ids) == body["max_tokens"] == usage["completion_tokens"]

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    usages = [u for _, u in results]
    spec = [u["spec_decode"] for u in usages]
    drafts = sum(s["num_drafts"] for s in spec)
    accepted = sum(s["num_accepted_tokens"] for s in spec)
    assert drafts > 0 and 0 < accepted < sum(s["num_draft_tokens"] for s in spec)  # a partial draft
    assert delta("specserve:spec_decode_num_drafts_total") == drafts
    assert delta("specserve:spec_decode_num_draft_tokens_total") == sum(s["num_draft_tokens"] for s in spec)
    assert delta("specserve:spec_decode_num_accepted_tokens_total") == accepted
    for pos in range(K):
        assert delta("specserve:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == \
            sum(s["accepted_per_position"][pos] for s in spec)
    # mean acceptance length: /metrics (1 + accepted / drafts) == the same over the usage blocks
    from_metrics = 1 + delta("specserve:spec_decode_num_accepted_tokens_total") / \
        delta("specserve:spec_decode_num_drafts_total")
    assert from_metrics == 1 + accepted / drafts
    assert delta("specserve:prompt_tokens_total") == sum(u["prompt_tokens"] for u in usages)
    assert delta("specserve:generation_tokens_total") == sum(u["completion_tokens"] for u in usages)
    assert delta("specserve:request_success_total", finished_reason="length") == NUM_STREAMS
    assert delta("specserve:spec_decode_request_acceptance_length_count") == NUM_STREAMS
    assert delta("specserve:spec_decode_request_acceptance_length_sum") == \
        pytest.approx(sum(s["acceptance_length"] for s in spec), rel=1e-9)
    for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(f"specserve:{hist}_count") == NUM_STREAMS
    assert delta("specserve:inter_token_latency_seconds_count") > 0
    assert metric(after, "specserve:num_requests_running") == 0
    assert metric(after, "specserve:kv_cache_usage_perc") == 0
    assert metric(after, "specserve:spec_decode_draft_probs_bytes") == 0


def test_http_durations_hold_the_engine_time_and_label_handler_and_status(server, http: httpx.Client) -> None:
    """specserve:http_request_duration_seconds times each request on the server's side, from the
    app's first sight of it to its response's last byte: per handler and status class, never
    shorter than the engine's own e2e of the same requests; unknown paths count as "other"."""
    server.wait_idle()
    before = scrape(server.url)
    n = 3
    for i in range(n):
        r = http.post("/v1/completions", json={**_body(i), "stream": False, "stream_options": None})
        assert r.status_code == 200, r.text
    assert http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": -1}).status_code == 400
    assert http.get("/no/such/path").status_code == 404
    server.wait_idle()
    after = scrape(server.url)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    name = "specserve:http_request_duration_seconds"
    ok = {"method": "POST", "handler": "/v1/completions", "status": "2xx"}
    assert delta(f"{name}_count", **ok) == n
    assert delta(f"{name}_count", method="POST", handler="/v1/completions", status="4xx") == 1
    assert delta(f"{name}_count", method="GET", handler="other", status="4xx") == 1
    assert delta("specserve:e2e_request_latency_seconds_count") == n
    assert delta(f"{name}_sum", **ok) >= delta("specserve:e2e_request_latency_seconds_sum") > 0
