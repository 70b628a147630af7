"""Steps queued on the device whose tokens the host has not read yet.

``ModelRunner.launch_decode`` queues such a step and returns a ``LaunchedDecode``: the target
forward and the sampler are on the stream, and the sampled tokens are being copied into pinned
host memory behind them. ``collect`` waits for that copy alone, so a step queued *after* this
one (``ModelRunner.launch_decode(..., after=this)``, whose input tokens are this step's sampled
tokens, read on the device) keeps the GPU busy while the host commits this step's tokens. That
is the overlap of engine/decode_ahead.py.

``ModelRunner.launch`` starts any other step the same way as far as it goes without a host read
and returns a ``LaunchedStep``; EngineCore queues the next step so once the current one's tokens
are committed, before their text and outputs are built (``EngineCore._queue_next``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from specserve.engine.batch import ModelRunnerOutput
from specserve.engine.request import Request
from specserve.engine.runner.host_read import HostRead
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.transfer import to_device
from specserve.engine.runner.verifier import Verification


@dataclass
class LaunchedDecode:
    """One queued step of ``verification.sampling`` (each samples one token, nothing is drafted)."""

    verification: Verification
    read: HostRead
    clock: PhaseClock
    marks: tuple[Any, Any]     # the clock's marks around the target forward and the sampler

    def sampled_on_device(self, requests: list[Request]) -> torch.Tensor:
        """[len(requests)] int64: the token this step sampled for each, still on the device.
        The continuation of a step usually keeps all its rows in order: then the column itself
        (no index built on the host, copied and gathered: ~0.1 ms a step at batch 256)."""
        v = self.verification
        tokens = v.out[:, 0]
        if len(requests) == len(v.sampling) and all(
                r is s.request for r, s in zip(requests, v.sampling)):
            return tokens
        row = {id(s.request): i for i, s in enumerate(v.sampling)}
        index = to_device([row[id(r)] for r in requests], torch.int64, v.out.device)
        return tokens.index_select(0, index)

    def collect(self) -> ModelRunnerOutput:
        """Wait for this step's tokens (not for work queued after it) and return its results."""
        results = self.verification.finish(self.read.rows())
        t0, t1 = self.marks
        return ModelRunnerOutput(results, self.clock.seconds(t0, t1), 0.0,
                                 host_wait_seconds=self.read.waited)


@dataclass
class LaunchedStep:
    """Any scheduled step, started: what needs no host read is queued on the device (the target
    forward, the sampler, a chained draft program); ``collect`` reads the tokens and does the
    rest (``Speculator.launch``). EngineCore queues the next step this way before it turns the
    current one's tokens into text and outputs."""

    finish: Callable[[set], tuple[dict, Any, Any]]   # Speculator.launch's remainder
    clock: PhaseClock
    start: Any        # the clock's mark before the target forward
    sampled: Any      # ... and after the sampler: the target's part, timed at launch
    # requests no longer in the step (aborted or preempted after the launch): the host work
    # left to do proposes nothing for them, since their blocks are gone
    dropped: set = field(default_factory=set)

    @torch.inference_mode()
    def collect(self) -> ModelRunnerOutput:
        """The step's results. ``host_wait_seconds`` stays None: the host work of a step read
        before the next is queued is exposed, and the cost model learns it as such."""
        results, d0, d1 = self.finish(self.dropped)
        clock = self.clock
        return ModelRunnerOutput(results, clock.seconds(self.start, self.sampled), clock.seconds(d0, d1))
