"""ServerMetrics: the vLLM prefix and engine label, step timings and prefix-cache counters from StepStats."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specserve.engine.types import StepStats
from specserve.server.metrics import ServerMetrics


def samples(m: ServerMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_vllm_prefix_names_every_series_with_the_engine_label() -> None:
    spec = samples(ServerMetrics("m", 2))
    vllm = samples(ServerMetrics("m", 2, prefix="vllm"))
    assert all(name.startswith("specserve:") for name, _ in spec)
    assert all(name.startswith("vllm:") and dict(labels)["engine"] == "0" for name, labels in vllm)
    # the same series, only renamed and labelled
    renamed = {(n.replace("specserve:", "vllm:"), tuple(sorted(dict(l, engine="0").items()))) for n, l in spec}
    assert renamed == set(vllm)
    with pytest.raises(ValueError):
        ServerMetrics("m", 2, prefix="sglang")


def test_step_stats_feed_timings_and_prefix_cache_counters() -> None:
    m = ServerMetrics("m", 2, prefix="vllm")
    m.on_step(StepStats(num_prefix_cache_queries=48, num_prefix_cache_hits=32,
                        target_seconds=0.012, draft_seconds=0.003))
    m.on_step(StepStats(num_prefix_cache_queries=16, target_seconds=0.010))   # no draft ran
    m.on_step(StepStats())                                                   # an idle step
    s = samples(m)
    base = (("engine", "0"), ("model_name", "m"))
    assert s[("vllm:prefix_cache_queries_total", base)] == 64
    assert s[("vllm:prefix_cache_hits_total", base)] == 32
    assert s[("vllm:spec_decode_target_time_per_step_seconds_count", base)] == 2
    assert s[("vllm:spec_decode_target_time_per_step_seconds_sum", base)] == pytest.approx(0.022)
    assert s[("vllm:spec_decode_draft_time_per_step_seconds_count", base)] == 1
    assert s[("vllm:spec_decode_draft_time_per_step_seconds_sum", base)] == pytest.approx(0.003)
