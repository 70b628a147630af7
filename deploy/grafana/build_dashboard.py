"""Build the specserve Grafana dashboard (deploy/grafana/specserve.json) from this one description.

    python deploy/grafana/build_dashboard.py          # rewrite specserve.json
    python deploy/grafana/build_dashboard.py --check  # exit 1 if specserve.json is stale

The JSON is what users import and what the Helm chart ships (helm/specserve/dashboards/ links to
it); tests/deploy checks that it matches this file, parses in promtool and returns data from a
real Prometheus scraping a real server. Every ratio guards its denominator with ``> 0``, so an
idle model shows "No data" instead of NaN or a division by zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("specserve.json")
UID = "specserve-spec-decode"

SEL = 'model_name=~"$model_name", instance=~"$instance"'
RI = "$__rate_interval"


def rate(metric: str, by: str = "model_name", extra: str = "") -> str:
    """``sum by (by) (rate(metric{selector}[$__rate_interval]))``."""
    sel = SEL + (", " + extra if extra else "")
    return f"sum by ({by}) (rate({metric}{{{sel}}}[{RI}]))"


def ratio(num: str, den: str, on: str = "") -> str:
    """num / den, with the denominator guarded so that zero yields no series."""
    match = f" on ({on}) group_left ()" if on else ""
    return f"{num}\n  /{match} ({den} > 0)"


def quantile(q: float, hist: str) -> str:
    """A histogram percentile per model, only where the histogram counted something."""
    buckets = rate(f"{hist}_bucket", by="model_name, le")
    guard = f"({rate(f'{hist}_count')} > 0)"
    return f"histogram_quantile({q}, {buckets}\n  and on (model_name) {guard})"


def mean(hist: str) -> str:
    return ratio(rate(f"{hist}_sum"), rate(f"{hist}_count"))


ACCEPTED = "specserve:spec_decode_num_accepted_tokens_total"
DRAFTS = "specserve:spec_decode_num_drafts_total"
DRAFT_TOKENS = "specserve:spec_decode_num_draft_tokens_total"
PER_POS = "specserve:spec_decode_num_accepted_tokens_per_pos_total"
REQ_ACC_LEN = "specserve:spec_decode_request_acceptance_length"

ACCEPTANCE_LENGTH = "1 + " + ratio(rate(ACCEPTED), rate(DRAFTS))


def target(expr: str, legend: str, ref: str, **extra: Any) -> dict:
    return {"refId": ref, "expr": expr, "legendFormat": legend, "range": True,
            "datasource": {"type": "prometheus", "uid": "${datasource}"}, **extra}


def panel(kind: str, title: str, description: str, targets: list[tuple[str, str]],
          unit: str = "short", w: int = 12, h: int = 8, **field: Any) -> dict:
    """One panel; ``targets`` is a list of (expr, legend)."""
    refs = "ABCDEFGH"
    defaults: dict[str, Any] = {"unit": unit, **field}
    options: dict[str, Any] = {"tooltip": {"mode": "multi", "sort": "desc"},
                               "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom",
                                          "calcs": []}}
    if kind == "stat":
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    if kind == "heatmap":
        options = {"calculate": False, "yAxis": {"unit": unit},
                   "cellValues": {"unit": "reqps"}, "color": {"scheme": "Blues", "mode": "scheme"},
                   "tooltip": {"mode": "single", "yHistogram": True}}
    return {
        "type": kind, "title": title, "description": description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": [target(e, legend, refs[i], **({"format": "heatmap"} if kind == "heatmap" else {}))
                    for i, (e, legend) in enumerate(targets)],
    }


def percentiles(title: str, what: str, hist: str) -> dict:
    return panel("timeseries", title,
                 f"{what}: p50, p90, p99 and the mean per model, from the histogram "
                 f"`{hist}` over $__rate_interval.",
                 [(quantile(0.5, hist), "{{model_name}} p50"),
                  (quantile(0.9, hist), "{{model_name}} p90"),
                  (quantile(0.99, hist), "{{model_name}} p99"),
                  (mean(hist), "{{model_name}} mean")], unit="s", w=8)


def spec_decode_panels() -> list[dict]:
    return [
        panel("stat", "Mean acceptance length",
              "Tokens emitted per target verification step: 1 + accepted / drafts (the bonus "
              "token included; at most k + 1). 1.0 means every draft token was rejected.",
              [(ACCEPTANCE_LENGTH, "{{model_name}}")], unit="none", w=6, h=5, decimals=2),
        panel("stat", "Acceptance rate",
              "Accepted draft tokens / proposed draft tokens.",
              [(ratio(rate(ACCEPTED), rate(DRAFT_TOKENS)), "{{model_name}}")],
              unit="percentunit", w=6, h=5, min=0, max=1),
        panel("stat", "Generation throughput", "Output tokens per second, all selected instances.",
              [(rate("specserve:generation_tokens_total"), "{{model_name}}")], unit="tps", w=6, h=5),
        panel("stat", "Waiting requests", "Requests queued, not yet scheduled, summed over instances.",
              [(f"sum by (model_name) (specserve:num_requests_waiting{{{SEL}}})", "{{model_name}}")],
              w=6, h=5),
        panel("timeseries", "Acceptance length: aggregate and per request",
              "Aggregate: 1 + accepted / drafts over all steps (long completions weigh more). "
              "Per-request mean: the average of each finished request's own 1 + accepted / drafts "
              f"(`{REQ_ACC_LEN}`), so every request counts once.",
              [(ACCEPTANCE_LENGTH, "{{model_name}} aggregate"),
               (mean(REQ_ACC_LEN), "{{model_name}} per-request mean")], unit="none", min=1),
        panel("timeseries", "Acceptance rate per draft position",
              "Position i: the fraction of drafts whose first i + 1 tokens were all accepted. "
              "One series per position; it never rises with i. A steep fall says k is too large.",
              [(ratio(rate(PER_POS, by="model_name, position"), rate(DRAFTS), on="model_name"),
                "{{model_name}} position {{position}}")], unit="percentunit", min=0, max=1),
        panel("heatmap", "Per-request acceptance length distribution",
              f"Finished requests per second in each acceptance-length bucket (`{REQ_ACC_LEN}`). "
              "A wide spread means the draft suits some prompts far better than others.",
              [(f"sum by (le) (rate({REQ_ACC_LEN}_bucket{{{SEL}}}[{RI}]))", "{{le}}")], unit="none"),
        panel("timeseries", "Per-request acceptance length percentiles",
              "p10, p50 and p90 of the per-request acceptance length over $__rate_interval.",
              [(quantile(0.1, REQ_ACC_LEN), "{{model_name}} p10"),
               (quantile(0.5, REQ_ACC_LEN), "{{model_name}} p50"),
               (quantile(0.9, REQ_ACC_LEN), "{{model_name}} p90")], unit="none", min=1),
        panel("timeseries", "Draft, accepted and rejected tokens per second",
              "Draft tokens proposed, accepted by the target, and rejected (proposed - accepted). "
              "Rejected tokens are the draft model's wasted work.",
              [(rate(DRAFT_TOKENS), "{{model_name}} drafted"),
               (rate(ACCEPTED), "{{model_name}} accepted"),
               (f"{rate(DRAFT_TOKENS)}\n  - {rate(ACCEPTED)}", "{{model_name}} rejected")],
              unit="tps", min=0),
        panel("timeseries", "Draft-probability memory",
              "Bytes held by stored draft probabilities (kept until verification, also across "
              "preemption). Zero with --draft-sample-method greedy.",
              [(f"sum by (model_name, instance) (specserve:spec_decode_draft_probs_bytes{{{SEL}}})",
                "{{model_name}} {{instance}}")], unit="bytes", min=0),
    ]


def serving_panels() -> list[dict]:
    return [
        panel("timeseries", "Token throughput", "Prompt tokens computed and output tokens generated per second.",
              [(rate("specserve:prompt_tokens_total"), "{{model_name}} prompt"),
               (rate("specserve:generation_tokens_total"), "{{model_name}} generation")], unit="tps", min=0),
        panel("timeseries", "Finished requests by reason",
              "Requests finished per second: stop (EOS or stop string), length, abort (client gone), error.",
              [(rate("specserve:request_success_total", by="model_name, finished_reason"),
                "{{model_name}} {{finished_reason}}")], unit="reqps", min=0),
        percentiles("Time to first token", "Arrival to first output token", "specserve:time_to_first_token_seconds"),
        percentiles("Inter-token latency", "Time between consecutive output tokens (several tokens "
                    "of one accepted draft arrive together)", "specserve:inter_token_latency_seconds"),
        percentiles("End-to-end request latency", "Arrival to the last token", "specserve:e2e_request_latency_seconds"),
        percentiles("Queue time", "Arrival to first scheduling", "specserve:request_queue_time_seconds"),
    ]


def scheduler_panels() -> list[dict]:
    return [
        panel("timeseries", "Running and waiting requests",
              "Requests in the running batch and in the waiting queue, per instance.",
              [(f"sum by (model_name, instance) (specserve:num_requests_running{{{SEL}}})",
                "{{instance}} running"),
               (f"sum by (model_name, instance) (specserve:num_requests_waiting{{{SEL}}})",
                "{{instance}} waiting")], min=0, w=8),
        panel("timeseries", "KV cache usage",
              "Fraction of KV-cache blocks in use (target and draft), per instance.",
              [(f"max by (model_name, instance) (specserve:kv_cache_usage_perc{{{SEL}}})", "{{instance}}")],
              unit="percentunit", min=0, max=1, w=8),
        panel("timeseries", "Preemptions and free KV blocks",
              "Requests preempted per second when the KV cache runs out (left axis), and free "
              "KV-cache blocks (right axis).",
              [(rate("specserve:num_preemptions_total", by="model_name, instance"), "{{instance}} preemptions/s"),
               (f"min by (model_name, instance) (specserve:kv_cache_free_blocks{{{SEL}}})",
                "{{instance}} free blocks")], w=8),
    ]


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": 24, "h": 1}}


def layout(panels: list[dict]) -> list[dict]:
    """Give every panel an id and an x/y position, filling 24-column rows left to right."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24 or p["type"] == "row":
            x, y, row_h = 0, y + row_h, 0
        p["id"] = i
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        x, row_h = x + w, max(row_h, h)
        if p["type"] == "row":
            x, y, row_h = 0, y + h, 0
    return panels


def variables() -> list[dict]:
    ds = {"type": "prometheus", "uid": "${datasource}"}

    def label_var(name: str, label: str, query: str) -> dict:
        return {"name": name, "label": label, "type": "query", "datasource": ds,
                "query": {"query": query, "refId": f"{name}-var"},
                "refresh": 2, "multi": True, "includeAll": True, "allValue": ".*", "sort": 1,
                "current": {"selected": True, "text": ["All"], "value": ["$__all"]}}

    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0, "refresh": 1, "regex": ""},
        label_var("model_name", "Model", "label_values(specserve:num_requests_running, model_name)"),
        label_var("instance", "Instance",
                  'label_values(specserve:num_requests_running{model_name=~"$model_name"}, instance)'),
    ]


def dashboard() -> dict:
    panels = ([row("Speculative decoding")] + spec_decode_panels()
              + [row("Throughput and latency")] + serving_panels()
              + [row("Scheduler and KV cache")] + scheduler_panels())
    return {
        "uid": UID, "title": "specserve: speculative decoding",
        "description": "Acceptance, throughput, latency and KV cache of specserve servers.",
        "tags": ["specserve", "llm", "speculative-decoding"],
        "editable": True, "graphTooltip": 1, "schemaVersion": 39, "version": 1,
        "refresh": "30s", "time": {"from": "now-1h", "to": "now"}, "timezone": "",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": variables()},
        "panels": layout(panels),
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
