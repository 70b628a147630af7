"""The Grafana dashboard, without a Grafana: built by grafana-foundation-sdk's builders, structure,
PromQL syntax (promtool, under both metric prefixes), metric names (those server/metrics.py
exports, every one of them shown), guarded denominators, and that the committed JSON is what
build_dashboard.py produces.

That every query returns data from a real Prometheus is test_dashboard_live.py.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy._tools import (DASHBOARD, ROOT, as_rule_file, concrete, dashboard,
                                 dashboard_queries, find_tool, need_module, run)

PREFIXES = ("specserve", "vllm")


def exported() -> dict[str, set[str]]:
    """Metric family -> its sample names, as server/metrics.py registers them (default prefix)."""
    from specserve.server.metrics import ServerMetrics

    families = ServerMetrics("m", 3).registry.collect()
    return {f.name: {sample.name for sample in f.samples} for f in families}


def build_module():
    spec = importlib.util.spec_from_file_location("build_dashboard", BUILDER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


BUILDER = ROOT / "deploy" / "grafana" / "build_dashboard.py"

REQUIRED_PANELS = [
    "Mean acceptance length", "Acceptance rate", "Acceptance rate per draft position",
    "Per-request acceptance length distribution", "Draft, accepted and rejected tokens per second",
    "Token throughput", "Time to first token", "Inter-token latency", "End-to-end request latency",
    "Running and waiting requests", "KV cache usage", "Preemptions and free KV blocks",
    "Draft-probability memory",
    # issue 18
    "Time to first token heatmap", "Inter-token latency heatmap", "End-to-end latency heatmap",
    "Draft vs target time per step", "Draft share of step time", "Prefix-cache hit rate",
    "Chosen k distribution", "Chosen k over time", "Predicted vs measured speed-up",
]


def panels() -> list[dict]:
    return [p for p in dashboard()["panels"] if p["type"] != "row"]


def test_json_is_what_the_generator_builds() -> None:
    proc = subprocess.run([sys.executable, str(BUILDER), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_built_with_the_sdk_builders() -> None:
    """build_dashboard.py makes the dashboard with grafana-foundation-sdk's typed builders."""
    need_module("grafana_foundation_sdk", "grafana-foundation-sdk==1769699379!11.6.0")
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models import dashboard as gd

    module = build_module()
    assert isinstance(module.builder(), db.Dashboard)
    model = module.dashboard()
    assert isinstance(model, gd.Dashboard)
    assert all(isinstance(p, (gd.Panel, gd.RowPanel)) for p in model.panels)
    assert "json.dumps({" not in BUILDER.read_text() and '"type": "timeseries"' not in BUILDER.read_text()
    kinds = {p["type"] for p in dashboard()["panels"]}
    assert kinds == {"row", "stat", "timeseries", "heatmap", "gauge"}


def test_template_variables() -> None:
    variables = {v["name"]: v for v in dashboard()["templating"]["list"]}
    assert list(variables) == ["datasource", "prefix", "model_name", "instance"]
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    prefix = variables["prefix"]
    assert prefix["type"] == "custom" and prefix["query"] == ",".join(PREFIXES)
    assert prefix["current"]["value"] == "specserve", "the server's default prefix is the default"
    assert [o["value"] for o in prefix["options"]] == list(PREFIXES)
    for name in ("model_name", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["multi"] and v["allValue"] == ".*"
        assert v["query"]["query"].startswith("label_values(${prefix}:") and f", {name})" in v["query"]["query"]
    assert "$model_name" in variables["instance"]["query"]["query"], "instances follow the chosen model"


def test_panels_are_complete_and_explained() -> None:
    titles = [p["title"] for p in panels()]
    for title in REQUIRED_PANELS:
        assert title in titles, f"missing panel {title!r}"
    assert len(set(titles)) == len(titles)
    ids = [p["id"] for p in dashboard()["panels"]]
    assert len(set(ids)) == len(ids)
    for p in panels():
        assert len(p["description"]) > 30, f"{p['title']}: say what the panel means"
        assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert 'model_name=~"$model_name"' in t["expr"] and 'instance=~"$instance"' in t["expr"]
            assert "specserve:" not in t["expr"] and "vllm:" not in t["expr"], "names go through ${prefix}"


def test_panels_do_not_overlap() -> None:
    cells: dict[tuple[int, int], str] = {}
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]


def test_per_position_panel_has_one_series_per_position() -> None:
    (p,) = [p for p in panels() if p["title"] == "Acceptance rate per draft position"]
    (t,) = p["targets"]
    assert "sum by (model_name, position)" in t["expr"] and "{{position}}" in t["legendFormat"]
    assert "group_left" in t["expr"]


def test_only_known_metrics_and_every_one_shown() -> None:
    families = exported()
    known = set().union(*families.values())
    used = set()
    for title, ref, expr in dashboard_queries():
        for name in re.findall(r"specserve:[a-z0-9_]+", concrete(expr)):
            assert name in known, f"{title} {ref}: unknown metric {name}"
            used.add(name)
    unshown = [f for f, samples in families.items() if not samples & used]
    assert not unshown, f"exported but on no panel: {unshown}"


def test_new_panels_read_the_right_series() -> None:
    by_title = {p["title"]: p for p in panels()}
    for title, hist in (("Time to first token heatmap", "time_to_first_token_seconds"),
                        ("Inter-token latency heatmap", "inter_token_latency_seconds"),
                        ("End-to-end latency heatmap", "e2e_request_latency_seconds"),
                        ("Chosen k distribution", "spec_decode_chosen_k")):
        p = by_title[title]
        (t,) = p["targets"]
        assert p["type"] == "heatmap" and t["format"] == "heatmap" and p["options"]["calculate"] is False
        assert t["expr"].startswith(f"sum by (le) (rate(${{prefix}}:{hist}_bucket{{")
    times = " ".join(t["expr"] for t in by_title["Draft vs target time per step"]["targets"])
    assert "spec_decode_draft_time_per_step_seconds" in times and "spec_decode_target_time_per_step_seconds" in times
    (hit,) = by_title["Prefix-cache hit rate"]["targets"]
    num, den = hit["expr"].split("/")
    assert "prefix_cache_hits_total" in num and "prefix_cache_queries_total" in den
    speedup = by_title["Predicted vs measured speed-up"]
    assert speedup["type"] == "gauge"
    assert [t["legendFormat"].split()[-1] for t in speedup["targets"]] == ["predicted", "measured"]
    assert "spec_decode_chosen_k_sum" in by_title["Chosen k over time"]["targets"][0]["expr"]


def _unguarded_divisions(expr: str) -> list[str]:
    """Denominators of `/` that are not `(... > 0)`; `/` inside [] or strings is skipped."""
    bad = []
    for m in re.finditer(r"/(\s*on\s*\([^)]*\)\s*group_left\s*\([^)]*\))?\s*", expr):
        rest = expr[m.end():]
        if not rest.startswith("("):
            bad.append(rest[:40])
            continue
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                if not re.search(r">\s*0\s*\)$", rest[: i + 1]):
                    bad.append(rest[: i + 1])
                break
    return bad


def test_every_ratio_guards_its_denominator() -> None:
    assert _unguarded_divisions("a / (b > 0)") == []
    assert _unguarded_divisions("a / b") and _unguarded_divisions("a / (b)")
    divisions = 0
    for title, ref, expr in dashboard_queries():
        divisions += expr.count("/")
        assert not _unguarded_divisions(expr), f"{title} {ref}: unguarded {_unguarded_divisions(expr)}"
    assert divisions >= 8


@pytest.mark.parametrize("prefix", PREFIXES)
def test_every_query_parses_in_promtool(tmp_path: Path, prefix: str) -> None:
    exprs = [concrete(e, prefix=prefix) for _, _, e in dashboard_queries()]
    assert len(exprs) >= 50 and all(f"{prefix}:" in e for e in exprs)
    rules = tmp_path / "dashboard-rules.yml"
    rules.write_text(as_rule_file(exprs))
    proc = run([find_tool("promtool"), "check", "rules", str(rules)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout
    # and the check bites: a missing parenthesis is refused
    rules.write_text(as_rule_file([exprs[0][:-1]]))
    assert run([find_tool("promtool"), "check", "rules", str(rules)]).returncode != 0


def test_dashboard_file_is_plain_importable_json() -> None:
    text = DASHBOARD.read_text()
    assert "__inputs" not in text, "the sidecar does not resolve import-time inputs; use ${datasource}"
    d = dashboard()
    assert d["uid"] and d["schemaVersion"] >= 36 and d["title"].startswith("specserve")


def test_acceptance_length_formula() -> None:
    (p,) = [p for p in panels() if p["title"] == "Mean acceptance length"]
    expr = p["targets"][0]["expr"]
    assert expr.startswith("1 + sum by (model_name) (rate(${prefix}:spec_decode_num_accepted_tokens_total")
    assert "${prefix}:spec_decode_num_drafts_total" in expr.split("/")[1]


def _lost_in_round_trip(ours: Any, back: Any, path: str = "") -> list[str]:
    """Keys or values of ``ours`` that the Grafana schema dropped or changed (defaults it adds are fine)."""
    if isinstance(ours, dict) and isinstance(back, dict):
        lost = [f"{path}/{k} dropped" for k in ours if k not in back]
        return lost + [x for k in ours if k in back for x in _lost_in_round_trip(ours[k], back[k], f"{path}/{k}")]
    if isinstance(ours, list) and isinstance(back, list) and len(ours) == len(back):
        return [x for i, (a, b) in enumerate(zip(ours, back)) for x in _lost_in_round_trip(a, b, f"{path}[{i}]")]
    return [] if ours == back else [f"{path}: {ours!r} became {back!r}"]


def test_grafana_11_schema_round_trip() -> None:
    """Grafana's own typed models (grafana-foundation-sdk 11.6) read every field we write."""
    import json

    need_module("grafana_foundation_sdk", "grafana-foundation-sdk==1769699379!11.6.0")
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import dashboard as gd
    from grafana_foundation_sdk.models import prometheus

    plugins.register_default_plugins()
    ours = dashboard()
    model = gd.Dashboard.from_json(ours)
    back = json.loads(json.dumps(model, cls=JSONEncoder))
    assert _lost_in_round_trip(ours, back) == []
    queries = [t for p in model.panels if isinstance(p, gd.Panel) for t in p.targets or []]
    assert len(queries) == len(dashboard_queries())
    assert all(isinstance(q, prometheus.Dataquery) for q in queries)
    # and the check bites: a misspelt key is dropped by the schema
    ours["panels"][1]["fieldConfg"] = {}
    back = json.loads(json.dumps(gd.Dashboard.from_json(ours), cls=JSONEncoder))
    assert _lost_in_round_trip(ours, back) == ["/panels[1]/fieldConfg dropped"]
