"""Prometheus metrics (the only prometheus_client user). Prefix ``specserve:``, label ``model_name``.

``--metrics-prefix vllm`` exports every series as ``vllm:<name>`` with vLLM's ``engine`` label ("0")
beside ``model_name``, so vLLM dashboards, alerts and the inference gateway's endpoint picker read them
unchanged. /metrics is prometheus-client's own ASGI app (:class:`MetricsApp`): it negotiates the
Prometheus text or OpenMetrics format from the Accept header.

Two sources feed them:

* every ``RequestOutput`` the server receives goes through a :class:`RequestTracker`, which turns the
  cumulative output into deltas: prompt/generation tokens, spec-decode counters, inter-token
  latency, and at the end the per-sequence histograms (TTFT, e2e, queue time, acceptance length)
  and ``request_success_total``. Counting from the outputs makes /metrics add up exactly to the
  ``usage`` blocks of the responses (1 + accepted / drafts from /metrics equals the same ratio over
  the usage blocks), and keeps it live while long requests run.
* ``StepStats`` from the engine's step listener: running / waiting / KV usage / draft-prob bytes
  gauges, preemptions, prefix-cache queries and hits (in tokens, as vLLM counts them) and the time
  the target and the draft took in the step (histograms); the gauges are refreshed from
  ``engine.debug_state()`` on every scrape so they are right even when the engine is idle.

A request with ``n`` choices counts as ``n`` sequences in the per-sequence metrics.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Optional

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from specserve.engine.types import CompletionOutput, FinishReason, RequestOutput, SpecDecodeStats, StepStats

prometheus_client.disable_created_metrics()  # no *_created series: counters only, as vLLM exports

PREFIX = "specserve:"
METRICS_PREFIXES = ("specserve", "vllm")
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
_STEP_PHASE_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.04,
                       0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0)
_FINISH_REASONS = tuple(r.value for r in FinishReason)


def acceptance_buckets(k: int) -> tuple[float, ...]:
    """1.0 .. k + 1 in steps of 0.25 (acceptance length = 1 + accepted / drafts lies in [1, k + 1])."""
    top = max(k, 1) + 1
    return tuple(1.0 + 0.25 * i for i in range(int((top - 1) / 0.25) + 1))


class CountsHistogram:
    """A Prometheus histogram over the integers 0..k_max fed with counts per value: one step adds
    how many requests chose each k, so a step costs k_max + 1 additions instead of one
    ``Histogram.observe`` per request (~2 us each under a lock, on the event loop that shares the
    GIL with the engine's thread: ~0.5 ms a step at batch 256). Exposed exactly as a
    ``Histogram`` with buckets ``le`` = 0, 1, .. k_max would be (a registry collector)."""

    def __init__(self, name: str, doc: str, label_names: tuple[str, ...],
                 label_values: tuple[str, ...], k_max: int):
        self.name, self.doc = name, doc
        self.label_names, self.label_values = list(label_names), list(label_values)
        self.counts = [0] * (k_max + 1)
        self._les = [floatToGoString(float(k)) for k in range(k_max + 1)]

    def add(self, counts: list[int]) -> None:
        """Add one step's counts (index k: requests that chose k; values past k_max go to the
        last bucket's +Inf only, which cannot happen with the engine's k_max)."""
        mine = self.counts
        for k, n in enumerate(counts):
            if n:
                if k >= len(mine):
                    mine.extend([0] * (k + 1 - len(mine)))
                mine[k] += n

    def describe(self):
        """The family without samples: the registry learns the series' names from it (``name[]``
        filters on /metrics, a duplicate name refused at registration)."""
        yield HistogramMetricFamily(self.name, self.doc, labels=self.label_names)

    def collect(self):
        counts = list(self.counts)      # one snapshot (the event loop adds between scrapes)
        fam = HistogramMetricFamily(self.name, self.doc, labels=self.label_names)
        buckets, total = [], 0
        for k, le in enumerate(self._les):
            total += counts[k]
            buckets.append((le, total))
        buckets.append(("+Inf", sum(counts)))
        fam.add_metric(self.label_values, buckets, sum_value=float(sum(k * n for k, n in enumerate(counts))))
        yield fam


class ServerMetrics:
    """All series for one served model, in a registry of their own (several apps may share a process)."""

    def __init__(self, model_name: str, num_speculative_tokens: int,
                 registry: Optional[CollectorRegistry] = None, prefix: str = "specserve"):
        if prefix not in METRICS_PREFIXES:
            raise ValueError(f"metrics prefix must be one of {METRICS_PREFIXES}, not {prefix!r}")
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        self.k = num_speculative_tokens
        self.prefix = prefix + ":"
        # vLLM labels every series with its engine index too; one engine here, so always "0"
        self._label_names = ("model_name", "engine") if prefix == "vllm" else ("model_name",)
        self._base = (model_name, "0") if prefix == "vllm" else (model_name,)
        self._build_spec_decode()
        self._build_serving()
        self.asgi_app = prometheus_client.make_asgi_app(self.registry)

    def _counter(self, name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
        return Counter(self.prefix + name, doc, self._label_names + labels, registry=self.registry)

    def _gauge(self, name: str, doc: str) -> Any:
        return Gauge(self.prefix + name, doc, self._label_names, registry=self.registry).labels(*self._base)

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...]) -> Any:
        return Histogram(self.prefix + name, doc, self._label_names, buckets=buckets,
                         registry=self.registry).labels(*self._base)

    def _build_spec_decode(self) -> None:
        m = self._base
        self.num_drafts = self._counter("spec_decode_num_drafts_total",
                                        "Verification steps that checked at least one draft token.").labels(*m)
        self.num_draft_tokens = self._counter("spec_decode_num_draft_tokens_total",
                                              "Draft tokens proposed and verified.").labels(*m)
        self.num_accepted = self._counter("spec_decode_num_accepted_tokens_total",
                                          "Draft tokens accepted by the target.").labels(*m)
        per_pos = self._counter("spec_decode_num_accepted_tokens_per_pos_total",
                                "Drafts whose first position+1 tokens were all accepted.", ("position",))
        self.accepted_per_pos = [per_pos.labels(*m, str(i)) for i in range(self.k)]
        self.acceptance_length = self._histogram(
            "spec_decode_request_acceptance_length",
            "Per finished sequence: 1 + accepted / drafts (unbiased by completion length).",
            acceptance_buckets(self.k))
        self.draft_probs_bytes = self._gauge("spec_decode_draft_probs_bytes",
                                             "Bytes held by stored draft probabilities.")
        self.target_step_time = self._histogram(
            "spec_decode_target_time_per_step_seconds",
            "Per engine step: the target's forward over all scheduled tokens plus verification "
            "(GPU time on CUDA).", _STEP_PHASE_BUCKETS)
        self.draft_step_time = self._histogram(
            "spec_decode_draft_time_per_step_seconds",
            "Per engine step that ran the draft: its catch-up and k proposal passes.", _STEP_PHASE_BUCKETS)
        self.chosen_k = CountsHistogram(
            self.prefix + "spec_decode_chosen_k",
            "Per sampling request per step: the drafts the adaptive controller allowed (0 = plain "
            "decoding; fixed mode: num_speculative_tokens, less near max_tokens).",
            self._label_names, self._base, self.k)
        self.registry.register(self.chosen_k)
        self.predicted_speedup = self._gauge(
            "spec_decode_predicted_speedup",
            "Adaptive k: the cost and acceptance models' goodput at the chosen k over plain decoding.")
        self.measured_speedup = self._gauge(
            "spec_decode_measured_speedup",
            "Adaptive k: recent committed tokens/s over the cost model's plain decoding at the same "
            "batch sizes.")

    def _build_serving(self) -> None:
        m = self._base
        self.ttft = self._histogram("time_to_first_token_seconds", "Arrival to first token.",
                                    _TTFT_BUCKETS)
        self.itl = self._histogram("inter_token_latency_seconds",
                                   "Time between consecutive outputs of a sequence (one per step).",
                                   _ITL_BUCKETS)
        self.e2e = self._histogram("e2e_request_latency_seconds", "Arrival to finish.", _REQUEST_BUCKETS)
        # the HTTP side of a request: from the app's first sight of it (its headers parsed) to
        # the last byte of its response handed to the socket, body reading, tokenization and
        # response building included; beside e2e it says whether slow requests lost their time
        # in the engine or around it (server/http_timing.py)
        self.http_duration = Histogram(
            self.prefix + "http_request_duration_seconds",
            "HTTP requests: the app's first sight of the request to its response's last byte.",
            self._label_names + ("method", "handler", "status"), buckets=_REQUEST_BUCKETS,
            registry=self.registry)
        for handler in ("/v1/completions", "/v1/chat/completions"):   # exported from the start, at 0
            self.http_duration.labels(*m, "POST", handler, "2xx")
        self.queue_time = self._histogram("request_queue_time_seconds",
                                          "Arrival to first scheduled.", _REQUEST_BUCKETS)
        self.running = self._gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = self._gauge("num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_usage = self._gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0..1).")
        self.kv_free_blocks = self._gauge("kv_cache_free_blocks", "Free KV-cache blocks.")
        self.preemptions = self._counter("num_preemptions_total", "Preempted sequences.").labels(*m)
        self.prompt_tokens = self._counter("prompt_tokens_total",
                                           "Prompt tokens of served requests.").labels(*m)
        self.generation_tokens = self._counter("generation_tokens_total",
                                               "Tokens generated (as returned to clients).").labels(*m)
        success = self._counter("request_success_total", "Finished sequences by finish reason.",
                                ("finished_reason",))
        self.success = {r: success.labels(*m, r) for r in _FINISH_REASONS}
        self.prefix_cache_queries = self._counter(
            "prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.").labels(*m)
        self.prefix_cache_hits = self._counter(
            "prefix_cache_hits_total", "Prompt tokens found in the prefix cache.").labels(*m)

    def observe_http(self, method: str, handler: str, status: str, seconds: float) -> None:
        """One HTTP request's time (server/http_timing.py picks the labels)."""
        self.http_duration.labels(*self._base, method, handler, status).observe(seconds)

    # ------------------------------------------------------------------------------ feeding

    def on_step(self, stats: StepStats) -> None:
        """The engine's step listener (called on the event loop after every step)."""
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_cache_usage)
        self.kv_free_blocks.set(stats.num_free_blocks)
        self.draft_probs_bytes.set(stats.draft_prob_bytes)
        if stats.num_preemptions:
            self.preemptions.inc(stats.num_preemptions)
        if stats.num_prefix_cache_queries:
            self.prefix_cache_queries.inc(stats.num_prefix_cache_queries)
            self.prefix_cache_hits.inc(stats.num_prefix_cache_hits)
        if stats.target_seconds > 0:
            self.target_step_time.observe(stats.target_seconds)
        if stats.draft_seconds > 0:
            self.draft_step_time.observe(stats.draft_seconds)
        if stats.spec_chosen_k:
            self.chosen_k.add(stats.spec_chosen_k)
        if stats.spec_predicted_speedup is not None:
            self.predicted_speedup.set(stats.spec_predicted_speedup)
        if stats.spec_measured_speedup is not None:
            self.measured_speedup.set(stats.spec_measured_speedup)

    def refresh(self, state: Mapping[str, Any]) -> None:
        """Set the gauges from ``engine.debug_state()`` (called on every scrape)."""
        total = state.get("num_total_blocks") or 0
        free = state.get("num_free_blocks", 0)
        if total:
            self.kv_usage.set(1.0 - free / total)
        self.kv_free_blocks.set(free)
        self.draft_probs_bytes.set(state.get("draft_prob_bytes", 0))
        if state.get("num_unfinished_requests", 0) == 0:
            self.running.set(0)
            self.waiting.set(0)

    def add_spec_decode(self, delta: SpecDecodeStats) -> None:
        if delta.num_drafts:
            self.num_drafts.inc(delta.num_drafts)
        if delta.num_draft_tokens:
            self.num_draft_tokens.inc(delta.num_draft_tokens)
        if delta.num_accepted_tokens:
            self.num_accepted.inc(delta.num_accepted_tokens)
        for pos, count in enumerate(delta.accepted_per_pos[: self.k]):
            if count:
                self.accepted_per_pos[pos].inc(count)

    def track(self, num_prompt_tokens: int, n: int) -> "RequestTracker":
        return RequestTracker(self, num_prompt_tokens, n)

    def render(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)


ASGIReceive = Callable[[], Awaitable[dict]]
ASGISend = Callable[[dict], Awaitable[None]]


class MetricsApp:
    """The /metrics endpoint: prometheus-client's own ASGI app (Accept negotiation between the text
    format and OpenMetrics, gzip, ``name[]`` filters) over the serving app's registry.
    ``before_scrape(app)`` refreshes the gauges and returns that app's :class:`ServerMetrics`.
    Add it as a plain route: Starlette calls an endpoint that is not a function as an ASGI app."""

    def __init__(self, before_scrape: Callable[[Any], ServerMetrics]):
        self._before_scrape = before_scrape

    async def __call__(self, scope: dict, receive: ASGIReceive, send: ASGISend) -> None:
        metrics = self._before_scrape(scope["app"])
        await metrics.asgi_app(_keep_colons(scope), receive, send)


def _keep_colons(scope: dict) -> dict:
    """Ask for ``escaping=allow-utf-8`` in every OpenMetrics Accept entry that names no escaping.

    prometheus-client 0.22+ answers an OpenMetrics request without an escaping (Prometheus 2.x sends
    none) with ``escaping=underscores`` and then writes sample names with ``:`` turned into ``_``
    while HELP/TYPE keep the colon (client_python issue 1177): ``vllm:num_requests_waiting`` would
    be stored as ``vllm_num_requests_waiting``. Our names are all valid legacy names, so the
    allow-utf-8 output is plain OpenMetrics 1.0 with every name exactly as registered."""
    headers = []
    for name, value in scope.get("headers", []):
        if name.lower() == b"accept":
            entries = value.split(b",")
            value = b",".join(e + b";escaping=allow-utf-8"
                              if b"openmetrics-text" in e and b"escaping=" not in e else e for e in entries)
        headers.append((name, value))
    return {**scope, "headers": headers}


def _spec_delta(now: SpecDecodeStats, before: SpecDecodeStats) -> SpecDecodeStats:
    per_pos = [v - (before.accepted_per_pos[i] if i < len(before.accepted_per_pos) else 0)
               for i, v in enumerate(now.accepted_per_pos)]
    return SpecDecodeStats(now.num_drafts - before.num_drafts,
                           now.num_draft_tokens - before.num_draft_tokens,
                           now.num_accepted_tokens - before.num_accepted_tokens, per_pos)


@dataclass
class _SeqState:
    num_tokens: int = 0
    last_token_time: Optional[float] = None
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    done: bool = False


class RequestTracker:
    """Turns one engine request's cumulative outputs into metric increments, exactly once each."""

    def __init__(self, metrics: ServerMetrics, num_prompt_tokens: int, n: int):
        self._m = metrics
        self._num_prompt_tokens = num_prompt_tokens
        self._prompt_counted = False
        self._seqs = [_SeqState() for _ in range(n)]

    @property
    def done(self) -> bool:
        return all(s.done for s in self._seqs)

    def update(self, out: RequestOutput) -> None:
        for comp in out.outputs:
            if 0 <= comp.index < len(self._seqs):
                self._update_seq(self._seqs[comp.index], comp)

    def _update_seq(self, seq: _SeqState, comp: CompletionOutput) -> None:
        if seq.done:
            return
        new_tokens = len(comp.token_ids) - seq.num_tokens
        if new_tokens > 0:
            if not self._prompt_counted:
                self._prompt_counted = True
                self._m.prompt_tokens.inc(self._num_prompt_tokens)
            self._m.generation_tokens.inc(new_tokens)
            now = comp.times.last_token or time.monotonic()
            if seq.last_token_time is not None:
                self._m.itl.observe(max(0.0, now - seq.last_token_time))
            seq.last_token_time = now
            seq.num_tokens = len(comp.token_ids)
        self._m.add_spec_decode(_spec_delta(comp.spec_decode, seq.spec))
        seq.spec = SpecDecodeStats()
        seq.spec.merge(comp.spec_decode)  # a snapshot: the engine's object is its own
        if comp.finish_reason is not None:
            self._finish_seq(seq, comp)

    def _finish_seq(self, seq: _SeqState, comp: CompletionOutput) -> None:
        seq.done = True
        reason = FinishReason(comp.finish_reason).value
        self._m.success[reason].inc()
        if reason not in (FinishReason.STOP.value, FinishReason.LENGTH.value):
            return
        t = comp.times
        if t.first_token is not None:
            self._m.ttft.observe(max(0.0, t.first_token - t.arrival))
        if t.first_scheduled is not None:
            self._m.queue_time.observe(max(0.0, t.first_scheduled - t.arrival))
        self._m.e2e.observe(max(0.0, (t.finished or time.monotonic()) - t.arrival))
        if comp.spec_decode.acceptance_length is not None:
            self._m.acceptance_length.observe(comp.spec_decode.acceptance_length)

    def abort_unfinished(self) -> None:
        """Count the sequences that never reported a finish (client gone, shutdown) as aborted."""
        for seq in self._seqs:
            if not seq.done:
                seq.done = True
                self._m.success[FinishReason.ABORT.value].inc()
