"""Public value types of the engine: what callers send in and get back.

The data chain, end to end:
``CompletionRequest (server) -> Request -> SchedulerOutput -> InputBatch -> ModelRunnerOutput
-> RequestOutput -> SSE chunk (server)``.

Nothing here imports torch: these objects cross the engine thread / event loop boundary.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:  # no import at run time: structured/ imports this module
    from specserve.engine.structured.params import StructuredOutputs


class ParamError(ValueError):
    """A request parameter that cannot be honoured; ``param`` names the offending field."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param
        self.message = message


class FinishReason(str, enum.Enum):
    STOP = "stop"        # EOS, a stop token id or a stop string
    LENGTH = "length"    # max_tokens or max_model_len reached
    ABORT = "abort"      # cancelled by the caller (client disconnect, shutdown)
    ERROR = "error"      # the engine failed while running this request

    def __str__(self) -> str:
        return self.value


def _finite(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ParamError(name, f"{name} must be a finite number, got {value!r}")


def _int_keys(bias: dict) -> dict[int, float]:
    """logit_bias keys as ints (JSON object keys arrive as strings)."""
    out = {}
    for key, value in bias.items():
        try:
            tok = int(key)
        except (TypeError, ValueError):
            raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key!r}") from None
        if isinstance(key, float) and key != tok:
            raise ParamError("logit_bias", f"logit_bias keys must be token ids, got {key!r}")
        out[tok] = value
    return out


@dataclass
class SamplingParams:
    """Per-request sampling options (the OpenAI fields plus vLLM's common extras).

    ``temperature == 0`` means greedy. ``top_k <= 0`` and ``top_p == 1`` disable those filters.
    ``max_tokens=None`` means the model's default length (``max_new_tokens`` of the generation
    config the engine was started with), capped by the context; without one, until the context is
    full. ``logprobs=None`` returns none;
    ``logprobs=N`` returns the sampled token's log-probability plus the top N.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: Optional[dict[int, float]] = None
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: Optional[int] = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_outputs: Optional["StructuredOutputs"] = None   # grammar the output must match

    MAX_N = 128
    MAX_LOGPROBS = 20
    MAX_STOP = 64

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            _finite(name, getattr(self, name))
        if not 1 <= self.n <= self.MAX_N:
            raise ParamError("n", f"n must be between 1 and {self.MAX_N}, got {self.n}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ParamError("temperature", f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ParamError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ParamError("top_k", f"top_k must be -1 (off), 0 (off) or positive, got {self.top_k}")
        if self.top_k == -1:
            self.top_k = 0
        if self.top_k > 2**31 - 1:
            raise ParamError("top_k", f"top_k must be below 2**31, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ParamError("min_p", f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ParamError(name, f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise ParamError("repetition_penalty",
                             f"repetition_penalty must be in (0, 10], got {self.repetition_penalty}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ParamError("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ParamError("min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ParamError("min_tokens", f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        if self.logprobs is not None and not 0 <= self.logprobs <= self.MAX_LOGPROBS:
            raise ParamError("logprobs", f"logprobs must be between 0 and {self.MAX_LOGPROBS}, got {self.logprobs}")
        if len(self.stop) > self.MAX_STOP:
            raise ParamError("stop", f"at most {self.MAX_STOP} stop strings are allowed, got {len(self.stop)}")
        if any(not s for s in self.stop):
            raise ParamError("stop", "stop strings must be non-empty")
        if self.seed is not None and not -(2**63) <= self.seed < 2**63:
            raise ParamError("seed", "seed must fit in a signed 64-bit integer")
        if self.logit_bias:
            self.logit_bias = _int_keys(self.logit_bias)
            for tok, bias in self.logit_bias.items():
                _finite("logit_bias", bias)
                if not -100.0 <= bias <= 100.0:
                    raise ParamError("logit_bias", f"logit_bias values must be in [-100, 100], got {bias}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


@dataclass(slots=True)
class SpecDecodeStats:
    """Speculative-decoding counters; used per request, per step and as running totals.

    ``accepted_per_pos[i]`` counts drafts whose first ``i + 1`` tokens were all accepted.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted: int) -> None:
        if num_draft_tokens <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        if len(self.accepted_per_pos) < num_draft_tokens:
            self.accepted_per_pos.extend([0] * (num_draft_tokens - len(self.accepted_per_pos)))
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    def merge(self, other: "SpecDecodeStats") -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        if len(self.accepted_per_pos) < len(other.accepted_per_pos):
            self.accepted_per_pos.extend([0] * (len(other.accepted_per_pos) - len(self.accepted_per_pos)))
        for i, v in enumerate(other.accepted_per_pos):
            self.accepted_per_pos[i] += v

    @property
    def acceptance_length(self) -> float | None:
        """Mean tokens emitted per verification: 1 + accepted / drafts (None before any draft)."""
        if self.num_drafts == 0:
            return None
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def as_dict(self) -> dict:
        return {
            "num_drafts": self.num_drafts,
            "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "accepted_per_position": list(self.accepted_per_pos),
            "acceptance_length": self.acceptance_length,
        }


@dataclass(slots=True)
class RequestTimes:
    """Wall-clock timestamps (time.monotonic()) of one request's life, for latency metrics."""

    arrival: float = 0.0
    first_scheduled: Optional[float] = None
    first_token: Optional[float] = None
    last_token: Optional[float] = None
    finished: Optional[float] = None
    num_preemptions: int = 0

    def copy(self) -> "RequestTimes":
        """A snapshot (every step's outputs carry one; ``dataclasses.replace`` costs 3x more)."""
        return RequestTimes(self.arrival, self.first_scheduled, self.first_token, self.last_token,
                            self.finished, self.num_preemptions)


@dataclass
class Logprob:
    token_id: int
    logprob: float
    # top alternatives at this position, best first: (token_id, logprob)
    top: list[tuple[int, float]] = field(default_factory=list)


class GrowingView(Sequence):
    """A read-only snapshot of ``items[start:stop]`` of a list that only ever grows by appends
    (a request's token ids, its logprobs): what a step's output reports without copying.

    Every step reports each request's output so far. As a list slice that is O(tokens so far)
    per request per step, O(n^2) over a generation: ~0.6 ms a step at batch 256 with 500 output
    tokens each on the CPU machine, in the engine thread that the device waits for at large
    batches. A view is O(1) to take; indexing, slicing (a list), ``len``, iteration and ``==``
    read the live list up to ``stop``, which the appends after the snapshot never change."""

    __slots__ = ("_items", "_start", "_stop")

    def __init__(self, items: list, start: int = 0, stop: Optional[int] = None):
        self._items, self._start = items, start
        self._stop = len(items) if stop is None else stop

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step == 1:
                return self._items[self._start + lo:self._start + max(lo, hi)]
            return [self._items[self._start + j] for j in range(lo, hi, step)]
        n = len(self)
        if not -n <= i < n:
            raise IndexError("view index out of range")
        return self._items[self._start + (i % n)]

    def __iter__(self):
        items = self._items
        for j in range(self._start, self._stop):
            yield items[j]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (GrowingView, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"GrowingView({self[:]!r})"


@dataclass(slots=True)
class CompletionOutput:
    """One of the ``n`` completions of a request. Text and token ids are cumulative; the engine
    hands out its token ids and logprobs as :class:`GrowingView` snapshots, not copies."""

    index: int
    text: str = ""
    token_ids: Sequence[int] = field(default_factory=list)
    logprobs: Optional[Sequence[Logprob]] = None
    finish_reason: Optional[FinishReason] = None
    stop_reason: int | str | None = None
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    times: RequestTimes = field(default_factory=RequestTimes)
    error: Optional[str] = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """What the engine reports for a request after a step (cumulative, not a delta)."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt: Optional[str] = None
    num_cached_prompt_tokens: int = 0

    @property
    def finished(self) -> bool:
        return all(o.finished for o in self.outputs)


@dataclass
class StepStats:
    """What one engine step did; exported as metrics by the server (never inside the engine)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0          # 0..1, fraction of KV blocks in use
    num_scheduled_tokens: int = 0
    num_prompt_tokens: int = 0           # prompt tokens computed this step (cache hits excluded)
    num_generation_tokens: int = 0       # tokens emitted this step
    num_preemptions: int = 0
    num_prefix_cache_queries: int = 0
    num_prefix_cache_hits: int = 0
    draft_prob_bytes: int = 0            # bytes stored draft probabilities keep alive after the step
    num_free_blocks: int = 0
    spec_decode: SpecDecodeStats = field(default_factory=SpecDecodeStats)
    step_seconds: float = 0.0
    target_seconds: float = 0.0          # target forward + verification (0 when no target ran)
    draft_seconds: float = 0.0           # draft catch-up + proposal (0 when no draft ran)
    host_wait_seconds: Optional[float] = None   # decode-ahead on CUDA: blocked on the tokens
    # sampling requests by the drafts allowed them this step: index k = 0..k_max (empty when no
    # request sampled); counts, not one entry per request, so a consumer's cost is per k
    spec_chosen_k: list[int] = field(default_factory=list)
    spec_predicted_speedup: Optional[float] = None   # adaptive k: goodput(k) / goodput(0)
    spec_measured_speedup: Optional[float] = None    # recent tokens/s / modelled plain tokens/s

    @property
    def max_chosen_k(self) -> int:
        """The widest k any sampling request was allowed this step (0 if none sampled)."""
        for k in range(len(self.spec_chosen_k) - 1, 0, -1):
            if self.spec_chosen_k[k]:
                return k
        return 0
