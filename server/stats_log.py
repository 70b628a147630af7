"""The periodic stats log line: what the engine did in the last interval, in one INFO line.

Every ``--log-stats-interval`` seconds (10 by default) while requests run or wait, and once more
after they have all finished, the ``specserve.stats`` logger writes e.g.::

    prompt 412.0 tok/s, generation 96.3 tok/s; running 4, waiting 1; KV cache 12.5% used;
    prefix cache hit rate 37.5%; spec decode: acceptance length 2.41, draft acceptance 47.0%
    (113 of 240), per position 0.812 0.475 0.125

(one line; wrapped here). The counts come from the engine's ``StepStats`` (a step listener, like
the metrics): prompt tokens the engine computed (prefix-cache hits are not recomputed, so they are
not counted), tokens generated, and the verification steps of the interval: acceptance length
= 1 + accepted / drafts, draft acceptance = accepted / draft tokens, and per position i the share
of drafts whose first i + 1 tokens were all accepted. The prefix-cache hit rate is over all
prompt tokens looked up since start-up. ``--disable-log-stats`` turns the line off.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from specserve.engine.types import SpecDecodeStats, StepStats

log = logging.getLogger("specserve.stats")

DEFAULT_INTERVAL_S = 10.0


@dataclass
class _Window:
    """What the steps of one interval added up to."""

    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    spec: SpecDecodeStats = field(default_factory=SpecDecodeStats)


class StatsLogger:
    """Feed it every step (``on_step``); ``line()`` closes the interval and says what happened."""

    def __init__(self, engine: Any, interval: float = DEFAULT_INTERVAL_S):
        if interval <= 0:
            raise ValueError(f"the stats log interval must be positive, got {interval}")
        self.engine = engine
        self.interval = interval
        self._window = _Window()
        self._since = time.monotonic()
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._running = 0
        self._waiting = 0
        self._was_active = False

    def on_step(self, stats: StepStats) -> None:
        """The engine's step listener (runs on the event loop, like the metrics')."""
        w = self._window
        w.steps += 1
        w.prompt_tokens += stats.num_prompt_tokens
        w.generation_tokens += stats.num_generation_tokens
        w.spec.merge(stats.spec_decode)
        self._prefix_queries += stats.num_prefix_cache_queries
        self._prefix_hits += stats.num_prefix_cache_hits
        self._running, self._waiting = stats.num_running, stats.num_waiting

    def line(self, now: Optional[float] = None) -> Optional[str]:
        """The line for the interval ending ``now`` (and a new interval starts), or None when the
        engine was idle throughout and the previous line already said so."""
        now = time.monotonic() if now is None else now
        seconds = max(now - self._since, 1e-9)
        w, self._window, self._since = self._window, _Window(), now
        state = self.engine.debug_state()
        if state.get("num_unfinished_requests", 0) == 0:
            self._running = self._waiting = 0   # no step reports the engine going idle
        active = w.steps > 0 or self._running + self._waiting > 0
        if not (active or self._was_active):
            return None
        self._was_active = active
        total = state.get("num_total_blocks") or 0
        kv_used = 1.0 - state.get("num_free_blocks", 0) / total if total else 0.0
        hit_rate = self._prefix_hits / self._prefix_queries if self._prefix_queries else 0.0
        text = (f"prompt {w.prompt_tokens / seconds:.1f} tok/s, generation "
                f"{w.generation_tokens / seconds:.1f} tok/s; running {self._running}, waiting "
                f"{self._waiting}; KV cache {100 * kv_used:.1f}% used; prefix cache hit rate "
                f"{100 * hit_rate:.1f}%")
        return text + _spec_part(w.spec)

    async def run(self) -> None:
        """Log a line every interval (until cancelled)."""
        while True:
            await asyncio.sleep(self.interval)
            text = self.line()
            if text is not None:
                log.info("%s", text)


def _spec_part(spec: SpecDecodeStats) -> str:
    if spec.num_drafts == 0:
        return ""
    per_pos = " ".join(f"{n / spec.num_drafts:.3f}" for n in spec.accepted_per_pos)
    rate = spec.num_accepted_tokens / spec.num_draft_tokens if spec.num_draft_tokens else 0.0
    return (f"; spec decode: acceptance length {spec.acceptance_length:.2f}, draft acceptance "
            f"{100 * rate:.1f}% ({spec.num_accepted_tokens} of {spec.num_draft_tokens}), "
            f"per position {per_pos}")
