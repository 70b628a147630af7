"""`specserve serve --metrics-prefix vllm`: queries written for vLLM's metric names return data.

A real server (the tiny pair of test_dashboard_live.py, started by its helpers) exports vLLM's names
and `engine` label; a real Prometheus scrapes it (negotiating OpenMetrics, as Prometheus does by
default). The queries below are written the way vLLM's own dashboards, alerts, production-stack's
KEDA trigger and the inference gateway's endpoint picker write them: none mentions specserve.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from typing import Iterator

import pytest

from tests.deploy._tools import concrete, dashboard_queries
from tests.deploy.test_dashboard_live import (MODEL, WINDOW, checkpoints, one_request, query,  # noqa: F401
                                              run_prometheus, run_server, scalar, wait_until)

pytestmark = [pytest.mark.needs_server, pytest.mark.timeout(180)]

SHARED_PROMPT = "def shared_helper(values):\n    total = 0\n    for v in values:\n        total += v\n" * 4

# Queries with vLLM's names, as vLLM's dashboards and tools write them.
VLLM_QUERIES = {
    "endpoint picker: queue depth": 'vllm:num_requests_waiting{model_name="%s"}',
    "endpoint picker: KV-cache use": 'vllm:kv_cache_usage_perc{model_name="%s"}',
    "running requests": 'sum by (model_name, engine) (vllm:num_requests_running{model_name="%s"})',
    "KEDA trigger (production-stack)": 'sum(vllm:num_requests_waiting{model_name="%s"})',
    "acceptance length": ('1 + sum(rate(vllm:spec_decode_num_accepted_tokens_total{model_name="%s"}[W]))'
                          ' / (sum(rate(vllm:spec_decode_num_drafts_total[W])) > 0)'),
    "acceptance per position": ('sum by (position) (rate(vllm:spec_decode_num_accepted_tokens_per_pos_total'
                                '{model_name="%s"}[W])) / on () group_left () '
                                '(sum(rate(vllm:spec_decode_num_drafts_total[W])) > 0)'),
    "draft acceptance rate": ('sum(rate(vllm:spec_decode_num_accepted_tokens_total{model_name="%s"}[W]))'
                              ' / sum(rate(vllm:spec_decode_num_draft_tokens_total[W]))'),
    "TTFT p99": ('histogram_quantile(0.99, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                 '{model_name="%s"}[W])))'),
    "ITL p50": 'histogram_quantile(0.5, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket{model_name="%s"}[W])))',
    "e2e mean": ('rate(vllm:e2e_request_latency_seconds_sum{model_name="%s"}[W])'
                 ' / rate(vllm:e2e_request_latency_seconds_count[W])'),
    "queue time": 'rate(vllm:request_queue_time_seconds_count{model_name="%s"}[W]) > 0',
    "prompt tokens": 'rate(vllm:prompt_tokens_total{model_name="%s"}[W]) > 0',
    "generation tokens": 'rate(vllm:generation_tokens_total{model_name="%s"}[W]) > 0',
    "finished by reason": 'sum by (finished_reason) (increase(vllm:request_success_total{model_name="%s"}[W])) > 0',
    "prefix-cache hit rate": ('sum(rate(vllm:prefix_cache_hits_total{model_name="%s"}[W]))'
                              ' / sum(rate(vllm:prefix_cache_queries_total[W])) > 0'),
    "preemptions": 'vllm:num_preemptions_total{model_name="%s"}',
    "target time per step": 'rate(vllm:spec_decode_target_time_per_step_seconds_count{model_name="%s"}[W]) > 0',
    "draft time per step": 'rate(vllm:spec_decode_draft_time_per_step_seconds_sum{model_name="%s"}[W]) > 0',
}


@pytest.fixture(scope="module")
def vllm_server(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_server(checkpoints, tmp_path_factory, "--metrics-prefix", "vllm")


@pytest.fixture(scope="module")
def vllm_prometheus(vllm_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_prometheus(vllm_server, tmp_path_factory)


@pytest.fixture(scope="module")
def vllm_load(vllm_server: str, vllm_prometheus: str) -> None:
    import httpx

    wait_until(lambda: query(vllm_prometheus, 'count_over_time(up{job="specserve"}[1m]) >= 2'),
               "two scrapes of the idle server", timeout=30)
    with cf.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: one_request(vllm_server, i), range(8)))
    for _ in range(2):  # the second copy of a long prompt finds its full blocks in the prefix cache
        r = httpx.post(vllm_server + "/v1/completions", timeout=60,
                       json={"model": MODEL, "prompt": SHARED_PROMPT, "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
    wait_until(lambda: scalar(vllm_prometheus, "sum(vllm:prefix_cache_hits_total)") > 0,
               "Prometheus to scrape the prefix-cache hits", timeout=15)
    time.sleep(1.5)


def test_vllm_names_and_engine_label_on_metrics(vllm_server: str) -> None:
    import httpx

    text = httpx.get(vllm_server + "/metrics", timeout=10).text
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert samples and all(line.startswith("vllm:") for line in samples), samples[:3]
    assert all('engine="0"' in line and f'model_name="{MODEL}"' in line for line in samples)
    assert "specserve:" not in text


def test_openmetrics_is_negotiated_by_the_accept_header(vllm_server: str) -> None:
    import httpx

    om = httpx.get(vllm_server + "/metrics", timeout=10,
                   headers={"Accept": "application/openmetrics-text; version=1.0.0; charset=utf-8"})
    assert om.status_code == 200
    assert om.headers["content-type"].startswith("application/openmetrics-text")
    assert om.text.rstrip().endswith("# EOF")
    # OpenMetrics names counters without _total in TYPE lines and keeps it on samples
    assert "# TYPE vllm:prompt_tokens counter" in om.text and "vllm:prompt_tokens_total{" in om.text
    plain = httpx.get(vllm_server + "/metrics", timeout=10)
    assert plain.headers["content-type"].startswith("text/plain")
    assert "# EOF" not in plain.text


def test_queries_written_for_vllm_return_data(vllm_prometheus: str, vllm_load: None) -> None:
    empty = []
    for what, q in VLLM_QUERIES.items():
        expr = (q % MODEL).replace("[W]", f"[{WINDOW}]")
        result = query(vllm_prometheus, expr)
        if not result:
            empty.append(f"{what}: {expr}")
        for series in result:
            if "engine" in series["metric"]:
                assert series["metric"]["engine"] == "0"
    assert not empty, "vLLM-style queries without data:\n" + "\n".join(empty)
    assert not query(vllm_prometheus, '{__name__=~"specserve:.+"}'), "no specserve: names with the vllm prefix"
    hit_rate = scalar(vllm_prometheus, "sum(vllm:prefix_cache_hits_total) / sum(vllm:prefix_cache_queries_total)")
    assert 0 < hit_rate < 1


def test_the_dashboard_with_prefix_vllm_returns_data(vllm_prometheus: str, vllm_load: None) -> None:
    """The dashboard's `prefix` variable set to vllm: every panel reads the vllm: series."""
    empty = []
    for title, ref, expr in dashboard_queries():
        q = concrete(expr, WINDOW, prefix="vllm")
        if not query(vllm_prometheus, q):
            empty.append(f"{title} [{ref}]: {q}")
    assert not empty, "dashboard queries without data under prefix vllm:\n" + "\n".join(empty)
