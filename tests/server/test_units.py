"""Server pieces without a server: metrics accounting from hand-made engine outputs, token bytes,
auth, and validation-error mapping."""

from __future__ import annotations

import pytest
from fastapi.exceptions import RequestValidationError
from prometheus_client.parser import text_string_to_metric_families

from specserve.engine.types import (CompletionOutput, FinishReason, RequestOutput, RequestTimes, SpecDecodeStats,
                          StepStats)
from specserve.server.auth import APIKeyChecker
from specserve.server.errors import validation_error
from specserve.server.metrics import ServerMetrics, acceptance_buckets
from specserve.server.tokens import TokenText


def _samples(m: ServerMetrics) -> dict:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"model_name": "m", **labels}.items())))]


def test_every_series_exists_at_start_up() -> None:
    s = _samples(ServerMetrics("m", 4))
    for pos in range(4):
        assert _get(s, "specserve:spec_decode_num_accepted_tokens_per_pos_total", position=str(pos)) == 0
    for reason in ("stop", "length", "abort", "error"):
        assert _get(s, "specserve:request_success_total", finished_reason=reason) == 0
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert _get(s, f"specserve:spec_decode_{name}_total") == 0
    assert not any(name.endswith("_created") for name, _ in s)
    assert acceptance_buckets(4) == (1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0,
                                     4.25, 4.5, 4.75, 5.0)


def _out(tokens: list[int], spec: SpecDecodeStats, times: RequestTimes, index: int = 0,
         finish: FinishReason | None = None) -> CompletionOutput:
    return CompletionOutput(index=index, text="x" * len(tokens), token_ids=list(tokens), finish_reason=finish,
                            spec_decode=spec, times=times)


def test_tracker_counts_deltas_exactly_once() -> None:
    m = ServerMetrics("m", 3)
    tracker = m.track(num_prompt_tokens=7, n=1)
    spec = SpecDecodeStats()
    t = RequestTimes(arrival=10.0, first_scheduled=10.5, first_token=11.0, last_token=11.0)
    tracker.update(RequestOutput("r", [1] * 7, [_out([5], spec, t)]))
    spec = SpecDecodeStats()
    spec.record(3, 3)
    t2 = RequestTimes(arrival=10.0, first_scheduled=10.5, first_token=11.0, last_token=11.25)
    out = RequestOutput("r", [1] * 7, [_out([5, 6, 7, 8, 9], spec, t2)])
    tracker.update(out)
    tracker.update(out)  # the same cumulative output again adds nothing
    spec3 = SpecDecodeStats()
    spec3.merge(spec)
    spec3.record(3, 1)
    t3 = RequestTimes(arrival=10.0, first_scheduled=10.5, first_token=11.0, last_token=11.75, finished=12.0)
    tracker.update(RequestOutput("r", [1] * 7, [_out([5, 6, 7, 8, 9, 10, 11], spec3, t3,
                                                     finish=FinishReason.LENGTH)]))
    tracker.abort_unfinished()  # nothing left unfinished: no abort counted
    s = _samples(m)
    assert _get(s, "specserve:prompt_tokens_total") == 7
    assert _get(s, "specserve:generation_tokens_total") == 7
    assert _get(s, "specserve:spec_decode_num_drafts_total") == 2
    assert _get(s, "specserve:spec_decode_num_draft_tokens_total") == 6
    assert _get(s, "specserve:spec_decode_num_accepted_tokens_total") == 4
    assert [_get(s, "specserve:spec_decode_num_accepted_tokens_per_pos_total", position=str(p))
            for p in range(3)] == [2, 1, 1]
    assert _get(s, "specserve:spec_decode_request_acceptance_length_sum") == 3.0  # 1 + 4/2
    assert _get(s, "specserve:inter_token_latency_seconds_count") == 2
    assert _get(s, "specserve:inter_token_latency_seconds_sum") == pytest.approx(0.75)
    assert _get(s, "specserve:time_to_first_token_seconds_sum") == pytest.approx(1.0)
    assert _get(s, "specserve:request_queue_time_seconds_sum") == pytest.approx(0.5)
    assert _get(s, "specserve:e2e_request_latency_seconds_sum") == pytest.approx(2.0)
    assert _get(s, "specserve:request_success_total", finished_reason="length") == 1
    assert _get(s, "specserve:request_success_total", finished_reason="abort") == 0


def test_unfinished_sequences_count_as_aborted_without_latencies() -> None:
    m = ServerMetrics("m", 2)
    tracker = m.track(num_prompt_tokens=3, n=2)
    t = RequestTimes(arrival=1.0, first_token=1.5, last_token=1.5)
    tracker.update(RequestOutput("r", [1, 2, 3], [_out([4], SpecDecodeStats(), t, index=0),
                                                  _out([5], SpecDecodeStats(), t, index=1)]))
    tracker.abort_unfinished()
    tracker.abort_unfinished()
    s = _samples(m)
    assert _get(s, "specserve:request_success_total", finished_reason="abort") == 2
    assert _get(s, "specserve:e2e_request_latency_seconds_count") == 0
    assert _get(s, "specserve:prompt_tokens_total") == 3  # counted once for both choices


def test_step_stats_and_scrape_refresh_set_the_gauges() -> None:
    m = ServerMetrics("m", 2)
    m.on_step(StepStats(num_running=3, num_waiting=2, kv_cache_usage=0.25, num_preemptions=1,
                        draft_prob_bytes=4096, num_free_blocks=30))
    s = _samples(m)
    assert _get(s, "specserve:num_requests_running") == 3 and _get(s, "specserve:num_requests_waiting") == 2
    assert _get(s, "specserve:kv_cache_usage_perc") == 0.25
    assert _get(s, "specserve:num_preemptions_total") == 1
    assert _get(s, "specserve:spec_decode_draft_probs_bytes") == 4096
    m.refresh({"num_free_blocks": 40, "num_total_blocks": 40, "num_unfinished_requests": 0,
               "draft_prob_bytes": 0})
    s = _samples(m)
    assert _get(s, "specserve:num_requests_running") == 0 and _get(s, "specserve:kv_cache_usage_perc") == 0
    assert _get(s, "specserve:kv_cache_free_blocks") == 40
    assert _get(s, "specserve:spec_decode_draft_probs_bytes") == 0


def test_chosen_k_histogram_from_counts_equals_one_observe_per_request() -> None:
    """Steps report requests per chosen k; the exported histogram (both prefixes) is the one a
    prometheus_client Histogram with buckets 0..k_max shows after one observe per request."""
    import prometheus_client

    steps = [[3, 0, 2, 0, 1], [0, 0, 0, 0, 7], [], [1, 1, 1, 1, 1]]
    for prefix in ("specserve", "vllm"):
        m = ServerMetrics("m", 4, prefix=prefix)
        ref_registry = prometheus_client.CollectorRegistry()
        labels = ("model_name", "engine") if prefix == "vllm" else ("model_name",)
        ref = prometheus_client.Histogram(f"{prefix}:spec_decode_chosen_k", "ref", labels,
                                          buckets=(0.0, 1.0, 2.0, 3.0, 4.0),
                                          registry=ref_registry).labels(*("m", "0")[:len(labels)])
        for counts in steps:
            m.on_step(StepStats(spec_chosen_k=counts))
            for k, n in enumerate(counts):
                for _ in range(n):
                    ref.observe(k)

        def series(text: str) -> dict:
            return {(x.name, tuple(sorted(x.labels.items()))): x.value
                    for f in text_string_to_metric_families(text) for x in f.samples
                    if "chosen_k" in x.name}

        got = series(m.render().decode())
        # the registry knows its names: a name filter keeps it, a second one is refused
        only = m.registry.restricted_registry([f"{prefix}:spec_decode_chosen_k_bucket"])
        assert len(series(prometheus_client.generate_latest(only).decode())) == 6
        with pytest.raises(ValueError):
            prometheus_client.Histogram(f"{prefix}:spec_decode_chosen_k", "dup", labels,
                                        registry=m.registry)
        assert got == series(prometheus_client.generate_latest(ref_registry).decode())
        assert len(got) == 8 and sorted(got.values())[-2:] == [18.0, 46.0]   # count, sum


def test_token_bytes_rebuild_any_text() -> None:
    from tests.helpers.checkpoints import build_tokenizer

    tok = build_tokenizer()
    tt = TokenText(tok)
    text = "Grüße aus Köln — naïve café, 東京, emoji 🚀✨ and def add(a, b):\n\treturn a + b"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert b"".join(bytes(tt.bytes(i)) for i in ids) == text.encode("utf-8")
    special = tok.convert_tokens_to_ids("<|end|>")
    assert tt.bytes(special) == list(b"<|end|>") and tt.text(special) == "<|end|>"
    assert all(tt.text(i) == tok.decode([i]) for i in ids)


def test_api_key_checker() -> None:
    auth = APIKeyChecker(["alpha", "beta"])
    assert auth.is_valid("Bearer alpha") and auth.is_valid("bearer beta")
    for bad in (None, "", "Bearer", "Bearer alph", "Bearer alphaa", "Basic alpha", "alpha"):
        assert not auth.is_valid(bad), bad
    assert not APIKeyChecker([]).enabled


def test_validation_errors_name_the_field() -> None:
    err = validation_error(RequestValidationError([
        {"type": "greater_than_equal", "loc": ("body", "max_tokens"), "msg": "Input should be >= 1"},
        {"type": "string_type", "loc": ("body", "messages", 0, "content", "str"), "msg": "bad"},
    ]))
    assert err.status == 400 and err.param == "max_tokens"
    assert "max_tokens" in err.message and "messages.0.content" in err.message


def test_http_timing_labels_errors_odd_methods_and_unknown_paths() -> None:
    """The HTTP timing layer, outermost as in the server, inside Starlette's error handling: an
    exception that escapes a route is a 5xx (the 500 is written outside this layer), a method
    outside the HTTP set and an unknown path each fold into "other"."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.testclient import TestClient

    from prometheus_client import generate_latest

    from specserve.server.http_timing import HTTPTimingMiddleware

    metrics = ServerMetrics("m", 2)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        raise RuntimeError("broken")

    @app.exception_handler(Exception)
    async def on_error(_request, _exc) -> JSONResponse:
        return JSONResponse({"error": "internal"}, status_code=500)

    app.add_middleware(HTTPTimingMiddleware, observe=metrics.observe_http)
    with TestClient(app, raise_server_exceptions=False) as client:
        assert client.get("/health").status_code == 500
        assert client.request("FOOBAR", "/x/1").status_code in (404, 405)
        assert client.request("FOOBAR", "/x/2").status_code in (404, 405)

    def count(**labels: str) -> float:
        for fam in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
            for s in fam.samples:
                if s.name.endswith("http_request_duration_seconds_count") and \
                        all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
        return 0.0

    assert count(method="GET", handler="/health", status="5xx") == 1
    assert count(method="other", handler="other", status="4xx") == 2
