"""Build the specserve Grafana dashboard (deploy/grafana/specserve.json) with grafana-foundation-sdk.

    python deploy/grafana/build_dashboard.py          # rewrite specserve.json
    python deploy/grafana/build_dashboard.py --check  # exit 1 if specserve.json is stale

Every panel, query and variable is made by the SDK's typed builders (Grafana 11.6 schema,
``grafana-foundation-sdk==1769699379!11.6.0``); this file only holds the PromQL and the layout. The
JSON is what users import and what the Helm chart ships (helm/specserve/dashboards/specserve.json
is a link to it); tests/deploy checks that it matches this file, round-trips through the SDK's
models, parses in promtool and returns data from a real Prometheus scraping a real server.

Metric names are written ``${prefix}:<name>``: the ``prefix`` variable (``specserve``, the server's
default, or ``vllm`` for ``--metrics-prefix vllm``) picks the family. Every ratio guards its
denominator with ``> 0``, so an idle model shows "No data" instead of NaN or a division by zero.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import gauge, heatmap, stat, timeseries
from grafana_foundation_sdk.builders import prometheus as pb
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models import prometheus as pm

OUT = Path(__file__).with_name("specserve.json")
UID = "specserve-spec-decode"
PREFIXES = ("specserve", "vllm")       # server/metrics.py METRICS_PREFIXES; the first is the default

SEL = 'model_name=~"$model_name", instance=~"$instance"'
RI = "$__rate_interval"
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def metric(name: str) -> str:
    """A series name under the dashboard's ``prefix`` variable."""
    return "${prefix}:" + name


def rate(name: str, by: str = "model_name", extra: str = "") -> str:
    """``sum by (by) (rate(<prefix>:name{selector}[$__rate_interval]))``."""
    sel = SEL + (", " + extra if extra else "")
    return f"sum by ({by}) (rate({metric(name)}{{{sel}}}[{RI}]))"


def ratio(num: str, den: str, on: str = "") -> str:
    """num / den, with the denominator guarded so that zero yields no series."""
    match = f" on ({on}) group_left ()" if on else ""
    return f"{num}\n  /{match} ({den} > 0)"


def quantile(q: float, hist: str, by: str = "model_name", extra: str = "") -> str:
    """A histogram percentile per ``by``, only where the histogram counted something; ``extra``:
    more label matchers."""
    buckets = rate(f"{hist}_bucket", by=f"{by}, le", extra=extra)
    guard = f"({rate(f'{hist}_count', by=by, extra=extra)} > 0)"
    return f"histogram_quantile({q}, {buckets}\n  and on ({by}) {guard})"


def mean(hist: str) -> str:
    return ratio(rate(f"{hist}_sum"), rate(f"{hist}_count"))


def gauge_of(name: str, agg: str = "sum", by: str = "model_name, instance", cond: str = "") -> str:
    return f"{agg} by ({by}) ({metric(name)}{{{SEL}}}{cond})"


def bucket_rates(hist: str) -> str:
    """Per-bucket rates for a heatmap (Grafana turns cumulative ``le`` buckets into cells)."""
    return f"sum by (le) (rate({metric(hist)}_bucket{{{SEL}}}[{RI}]))"


ACCEPTED = "spec_decode_num_accepted_tokens_total"
DRAFTS = "spec_decode_num_drafts_total"
DRAFT_TOKENS = "spec_decode_num_draft_tokens_total"
PER_POS = "spec_decode_num_accepted_tokens_per_pos_total"
REQ_ACC_LEN = "spec_decode_request_acceptance_length"
DRAFT_TIME = "spec_decode_draft_time_per_step_seconds"
TARGET_TIME = "spec_decode_target_time_per_step_seconds"
CHOSEN_K = "spec_decode_chosen_k"
TTFT = "time_to_first_token_seconds"
ITL = "inter_token_latency_seconds"
E2E = "e2e_request_latency_seconds"
QUEUE = "request_queue_time_seconds"
HTTP = "http_request_duration_seconds"
# the generation endpoints' answered requests (errors and refusals return early, and fast)
GENERATION_OK = 'handler=~".*completions", status="2xx"'

ACCEPTANCE_LENGTH = "1 + " + ratio(rate(ACCEPTED), rate(DRAFTS))


# ------------------------------------------------------------------------------------ panels
@dataclass
class Spec:
    """One panel before layout: its SDK builder and its size on the 24-column grid."""

    builder: Any
    w: int = 12
    h: int = 8
    is_row: bool = False


def query(expr: str, legend: str, ref: str, heat: bool = False) -> pb.Dataquery:
    q = pb.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range().datasource(DS)
    return q.format(pm.PromQueryFormat.HEATMAP) if heat else q


def _common(b: Any, title: str, description: str, targets: list[tuple[str, str]], unit: str,
            heat: bool = False, **field_config: Any) -> Any:
    b = b.title(title).description(description).datasource(DS).unit(unit)
    for i, (expr, legend) in enumerate(targets):
        b = b.with_target(query(expr, legend, "ABCDEFGH"[i], heat))
    for key, value in field_config.items():   # min, max, decimals: the builders' own setters
        b = getattr(b, key)(value)
    return b


def _legend() -> cb.VizLegendOptions:
    return (cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
            .placement(cm.LegendPlacement.BOTTOM).calcs([]))


def _tooltip(mode: cm.TooltipDisplayMode = cm.TooltipDisplayMode.MULTI) -> cb.VizTooltipOptions:
    return cb.VizTooltipOptions().mode(mode).sort(cm.SortOrder.DESCENDING)


def _last_value() -> cb.ReduceDataOptions:
    return cb.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def graph(title: str, description: str, targets: list[tuple[str, str]], unit: str = "short",
          w: int = 12, h: int = 8, **field_config: Any) -> Spec:
    b = _common(timeseries.Panel(), title, description, targets, unit, **field_config)
    return Spec(b.legend(_legend()).tooltip(_tooltip()), w, h)


def single(title: str, description: str, targets: list[tuple[str, str]], unit: str = "short",
           w: int = 6, h: int = 5, **field_config: Any) -> Spec:
    b = _common(stat.Panel(), title, description, targets, unit, **field_config)
    return Spec(b.reduce_options(_last_value()).color_mode(cm.BigValueColorMode.VALUE)
                .graph_mode(cm.BigValueGraphMode.AREA).text_mode(cm.BigValueTextMode.AUTO), w, h)


def dial(title: str, description: str, targets: list[tuple[str, str]], unit: str = "none",
         w: int = 8, h: int = 8, steps: Optional[list[tuple[Optional[float], str]]] = None,
         **field_config: Any) -> Spec:
    b = _common(gauge.Panel(), title, description, targets, unit, **field_config)
    if steps:
        b = b.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE)
                         .steps([dm.Threshold(value=v, color=c) for v, c in steps]))
    return Spec(b.reduce_options(_last_value()).show_threshold_markers(True)
                .show_threshold_labels(False), w, h)


def heat(title: str, description: str, expr: str, unit: str, w: int = 12, h: int = 8,
         cells: str = "reqps", scheme: str = "Blues") -> Spec:
    """A heatmap of a Prometheus histogram's buckets (``format: heatmap``, no recalculation)."""
    b = _common(heatmap.Panel(), title, description, [(expr, "{{le}}")], unit, heat=True)
    b = (b.calculate(False).y_axis(heatmap.YAxisConfig().unit(unit))
         .cell_values(heatmap.CellValues().unit(cells))
         .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME).scheme(scheme)
                .fill("dark-orange").scale(hm.HeatmapColorScale.EXPONENTIAL).exponent(0.5)
                .steps(64).reverse(False))
         .mode(cm.TooltipDisplayMode.SINGLE).show_y_histogram().show_color_scale(False)   # tooltip
         .show_legend())
    return Spec(b, w, h)


def row(title: str) -> Spec:
    return Spec(db.Row(title).collapsed(False), 24, 1, is_row=True)


def percentiles(title: str, what: str, hist: str) -> Spec:
    return graph(title, f"{what}: p50, p90, p99 and the mean per model, from the histogram "
                        f"`<prefix>:{hist}` over $__rate_interval.",
                 [(quantile(0.5, hist), "{{model_name}} p50"),
                  (quantile(0.9, hist), "{{model_name}} p90"),
                  (quantile(0.99, hist), "{{model_name}} p99"),
                  (mean(hist), "{{model_name}} mean")], unit="s", w=8)


def latency_heatmap(title: str, what: str, hist: str) -> Spec:
    return heat(title, f"{what}: sequences (or token gaps) per second in each bucket of "
                       f"`<prefix>:{hist}`, over time. The histogram's own buckets, so the y axis "
                       "is uneven; a second band shows a second population (e.g. long prompts).",
                bucket_rates(hist), unit="s", w=8, cells="reqps")


def spec_decode_panels() -> list[Spec]:
    return [
        single("Mean acceptance length",
               "Tokens emitted per target verification step: 1 + accepted / drafts (the bonus "
               "token included; at most k + 1). 1.0 means every draft token was rejected.",
               [(ACCEPTANCE_LENGTH, "{{model_name}}")], unit="none", decimals=2),
        single("Acceptance rate", "Accepted draft tokens / proposed draft tokens.",
               [(ratio(rate(ACCEPTED), rate(DRAFT_TOKENS)), "{{model_name}}")],
               unit="percentunit", min=0, max=1),
        single("Generation throughput", "Output tokens per second, all selected instances.",
               [(rate("generation_tokens_total"), "{{model_name}}")], unit="tps"),
        single("Waiting requests", "Requests queued, not yet scheduled, summed over instances.",
               [(gauge_of("num_requests_waiting", by="model_name"), "{{model_name}}")]),
        graph("Acceptance length: aggregate and per request",
              "Aggregate: 1 + accepted / drafts over all steps (long completions weigh more). "
              "Per-request mean: the average of each finished request's own 1 + accepted / drafts "
              f"(`<prefix>:{REQ_ACC_LEN}`), so every request counts once.",
              [(ACCEPTANCE_LENGTH, "{{model_name}} aggregate"),
               (mean(REQ_ACC_LEN), "{{model_name}} per-request mean")], unit="none", min=1),
        graph("Acceptance rate per draft position",
              "Position i: the fraction of drafts whose first i + 1 tokens were all accepted. "
              "One series per position; it never rises with i. A steep fall says k is too large.",
              [(ratio(rate(PER_POS, by="model_name, position"), rate(DRAFTS), on="model_name"),
                "{{model_name}} position {{position}}")], unit="percentunit", min=0, max=1),
        heat("Per-request acceptance length distribution",
             f"Finished requests per second in each acceptance-length bucket (`<prefix>:{REQ_ACC_LEN}`). "
             "A wide spread means the draft suits some prompts far better than others.",
             bucket_rates(REQ_ACC_LEN), unit="none"),
        graph("Per-request acceptance length percentiles",
              "p10, p50 and p90 of the per-request acceptance length over $__rate_interval.",
              [(quantile(0.1, REQ_ACC_LEN), "{{model_name}} p10"),
               (quantile(0.5, REQ_ACC_LEN), "{{model_name}} p50"),
               (quantile(0.9, REQ_ACC_LEN), "{{model_name}} p90")], unit="none", min=1),
        graph("Draft, accepted and rejected tokens per second",
              "Draft tokens proposed, accepted by the target, and rejected (proposed - accepted). "
              "Rejected tokens are the draft model's wasted work.",
              [(rate(DRAFT_TOKENS), "{{model_name}} drafted"),
               (rate(ACCEPTED), "{{model_name}} accepted"),
               (f"{rate(DRAFT_TOKENS)}\n  - {rate(ACCEPTED)}", "{{model_name}} rejected")],
              unit="tps", min=0),
        graph("Draft-probability memory",
              "Bytes held by stored draft probabilities (kept until verification, also across "
              "preemption). Zero with --draft-sample-method greedy.",
              [(gauge_of("spec_decode_draft_probs_bytes"), "{{model_name}} {{instance}}")],
              unit="bytes", min=0),
        graph("Draft vs target time per step",
              f"Mean and p90 seconds per engine step spent in the draft (`<prefix>:{DRAFT_TIME}`: "
              "its catch-up and k proposal passes, steps that ran the draft only) and in the target "
              f"(`<prefix>:{TARGET_TIME}`: forward over all scheduled tokens plus verification). "
              "GPU time on CUDA. The draft should cost a small fraction of the target.",
              [(mean(DRAFT_TIME), "{{model_name}} draft mean"),
               (mean(TARGET_TIME), "{{model_name}} target mean"),
               (quantile(0.9, DRAFT_TIME), "{{model_name}} draft p90"),
               (quantile(0.9, TARGET_TIME), "{{model_name}} target p90")], unit="s", min=0),
        graph("Draft share of step time",
              "Draft seconds / (draft + target seconds), summed over steps: the part of the "
              "model time that speculation adds. Compare it with the acceptance length: the draft "
              "pays off while the tokens it wins outweigh this share.",
              [(ratio(rate(f"{DRAFT_TIME}_sum"),
                      f"{rate(f'{DRAFT_TIME}_sum')} + {rate(f'{TARGET_TIME}_sum')}"),
                "{{model_name}} draft share")], unit="percentunit", min=0, max=1),
    ]


def adaptive_panels() -> list[Spec]:
    return [
        heat("Chosen k distribution",
             f"How many drafts the controller allowed each sampling request per step "
             f"(`<prefix>:{CHOSEN_K}`), as requests-steps per second per k. Adaptive mode picks k "
             "in 0..k_max every step (0 = plain decoding); fixed mode shows k_max, less near max_tokens.",
             bucket_rates(CHOSEN_K), unit="none", w=8, cells="short", scheme="Greens"),
        graph("Chosen k over time",
              "Mean k per request-step, and the share of request-steps decoded plainly (k = 0; "
              "a fraction, on the same axis). A mean near k_max says the draft earns its cost; "
              "a rising k = 0 share says the controller found speculation not worth it.",
              [(mean(CHOSEN_K), "{{model_name}} mean k"),
               (ratio(rate(f"{CHOSEN_K}_bucket", extra='le=~"0|0.0"'), rate(f"{CHOSEN_K}_count")),
                "{{model_name}} share at k = 0")], unit="none", min=0, w=8),
        dial("Predicted vs measured speed-up",
             "Adaptive k only (fixed mode: no data). Predicted: the cost and acceptance models' "
             "goodput at the chosen k over plain decoding (`<prefix>:spec_decode_predicted_speedup`). "
             "Measured: recent committed tokens/s over the cost model's plain decoding at the same "
             "batch sizes (`<prefix>:spec_decode_measured_speedup`). Below 1 (red): slower than "
             "decoding without a draft.",
             [(gauge_of("spec_decode_predicted_speedup", "avg", cond=" > 0"), "{{instance}} predicted"),
              (gauge_of("spec_decode_measured_speedup", "avg", cond=" > 0"), "{{instance}} measured")],
             unit="x", w=8, min=0, max=4, decimals=2,
             steps=[(None, "red"), (1.0, "yellow"), (1.2, "green")]),
    ]


def serving_panels() -> list[Spec]:
    return [
        graph("Token throughput", "Prompt tokens computed and output tokens generated per second.",
              [(rate("prompt_tokens_total"), "{{model_name}} prompt"),
               (rate("generation_tokens_total"), "{{model_name}} generation")], unit="tps", min=0),
        graph("Finished requests by reason",
              "Requests finished per second: stop (EOS or stop string), length, abort (client gone), error.",
              [(rate("request_success_total", by="model_name, finished_reason"),
                "{{model_name}} {{finished_reason}}")], unit="reqps", min=0),
        percentiles("Time to first token", "Arrival to first output token", TTFT),
        percentiles("Inter-token latency", "Time between consecutive output tokens (several tokens "
                    "of one accepted draft arrive together)", ITL),
        percentiles("End-to-end request latency", "Arrival to the last token", E2E),
        graph("HTTP time vs engine time (p99)",
              "The generation endpoints' p99 as the server's HTTP side times them (the app's first "
              "sight of a request to its response's last byte, `<prefix>:http_request_duration_seconds`) "
              "beside the engine's own (`<prefix>:e2e_request_latency_seconds`). A gap means requests "
              "wait around the engine: body reading, the event loop, response writing.",
              [(quantile(0.99, HTTP, extra=GENERATION_OK), "{{model_name}} HTTP p99"),
               (quantile(0.99, E2E), "{{model_name}} engine p99")], unit="s", min=0),
        latency_heatmap("Time to first token heatmap", "Arrival to first output token", TTFT),
        latency_heatmap("Inter-token latency heatmap", "Gaps between consecutive outputs of a sequence", ITL),
        latency_heatmap("End-to-end latency heatmap", "Arrival to the last token", E2E),
        percentiles("Queue time", "Arrival to first scheduling", QUEUE),
        graph("Prefix-cache hit rate",
              "Prompt tokens found in the prefix cache / prompt tokens looked up "
              "(`<prefix>:prefix_cache_hits_total` / `<prefix>:prefix_cache_queries_total`, counted "
              "in tokens as vLLM does). High when requests share system prompts or chat history.",
              [(ratio(rate("prefix_cache_hits_total"), rate("prefix_cache_queries_total")),
                "{{model_name}} hit rate")], unit="percentunit", min=0, max=1, w=8),
        graph("Prefix-cache lookups and hits",
              "Prompt tokens per second looked up in the prefix cache and found there.",
              [(rate("prefix_cache_queries_total"), "{{model_name}} looked up"),
               (rate("prefix_cache_hits_total"), "{{model_name}} hit")], unit="tps", min=0, w=8),
    ]


def scheduler_panels() -> list[Spec]:
    return [
        graph("Running and waiting requests",
              "Requests in the running batch and in the waiting queue, per instance.",
              [(gauge_of("num_requests_running"), "{{instance}} running"),
               (gauge_of("num_requests_waiting"), "{{instance}} waiting")], min=0, w=8),
        graph("KV cache usage", "Fraction of KV-cache blocks in use (target and draft), per instance.",
              [(gauge_of("kv_cache_usage_perc", "max"), "{{instance}}")],
              unit="percentunit", min=0, max=1, w=8),
        graph("Preemptions and free KV blocks",
              "Requests preempted per second when the KV cache runs out (left axis), and free "
              "KV-cache blocks (right axis).",
              [(rate("num_preemptions_total", by="model_name, instance"), "{{instance}} preemptions/s"),
               (gauge_of("kv_cache_free_blocks", "min"), "{{instance}} free blocks")], w=8),
    ]


def all_panels() -> list[Spec]:
    return ([row("Speculative decoding")] + spec_decode_panels()
            + [row("Adaptive speculation")] + adaptive_panels()
            + [row("Throughput and latency")] + serving_panels()
            + [row("Scheduler and KV cache")] + scheduler_panels())


def layout(specs: list[Spec]) -> list[Any]:
    """Give every panel an id and an x/y position, filling 24-column rows left to right."""
    x = y = row_h = 0
    built = []
    for i, s in enumerate(specs, start=1):
        if x + s.w > 24 or s.is_row:
            x, y, row_h = 0, y + row_h, 0
        s.builder.id(i).grid_pos(dm.GridPos(h=s.h, w=s.w, x=x, y=y))
        built.append(s)
        x, row_h = x + s.w, max(row_h, s.h)
        if s.is_row:
            x, y, row_h = 0, y + s.h, 0
    return built


# ------------------------------------------------------------------------------------ variables
def variables() -> list[Any]:
    all_selected = dm.VariableOption(selected=True, text=["All"], value=["$__all"])

    def label_var(name: str, label: str, query: str) -> db.QueryVariable:
        return (db.QueryVariable(name).label(label).datasource(DS)
                .query({"query": query, "refId": f"{name}-var"})
                .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
                .multi(True).include_all(True).all_value(".*").current(all_selected))

    default = PREFIXES[0]
    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus")
          .regex("").current(dm.VariableOption(selected=False, text="", value="")),
        db.CustomVariable("prefix").label("Metric prefix")
          .description("The server's --metrics-prefix: specserve (default) or vllm.")
          .values(",".join(PREFIXES))
          .current(dm.VariableOption(selected=True, text=default, value=default))
          .options([dm.VariableOption(selected=p == default, text=p, value=p) for p in PREFIXES]),
        label_var("model_name", "Model", f"label_values({metric('num_requests_running')}, model_name)"),
        label_var("instance", "Instance",
                  f'label_values({metric("num_requests_running")}{{model_name=~"$model_name"}}, instance)'),
    ]


# ------------------------------------------------------------------------------------ dashboard
def builder() -> db.Dashboard:
    b = (db.Dashboard("specserve: speculative decoding").uid(UID)
         .description("Acceptance, adaptive k, draft and target cost, throughput, latency, prefix "
                      "cache and KV cache of specserve servers.")
         .tags(["specserve", "llm", "speculative-decoding"]).editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("30s").time("now-1h", "now")
         .timezone("").version(1).variables(variables()))
    for s in layout(all_panels()):
        b = b.with_row(s.builder) if s.is_row else b.with_panel(s.builder)
    return b


def dashboard() -> dm.Dashboard:
    return builder().build()


def render() -> str:
    return json.dumps(dashboard(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
