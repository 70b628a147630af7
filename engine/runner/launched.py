"""A plain sampling step queued on the device whose tokens the host has not read yet.

``ModelRunner.launch_decode`` queues such a step and returns a ``LaunchedDecode``: the target
forward and the sampler are on the stream, and the sampled tokens are being copied into pinned
host memory behind them. ``collect`` waits for that copy alone, so a step queued *after* this
one (``ModelRunner.launch_decode(..., after=this)``, whose input tokens are this step's sampled
tokens, read on the device) keeps the GPU busy while the host commits this step's tokens. That
is the overlap of engine/decode_ahead.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from specserve.engine.batch import ModelRunnerOutput
from specserve.engine.runner.phase_clock import PhaseClock
from specserve.engine.runner.transfer import to_device
from specserve.engine.runner.verifier import Verification


class HostRead:
    """An asynchronous device-to-host copy of a small tensor; ``rows()`` waits for it alone.

    On CUDA the copy lands in pinned memory and an event marks its end; the stream may hold
    later work (the next step) that ``rows()`` does not wait for. On CPU the tensor is already
    on the host."""

    def __init__(self, t: torch.Tensor):
        self.event: Optional[torch.cuda.Event] = None
        self.waited: Optional[float] = None   # seconds ``rows`` blocked (CUDA only)
        if t.device.type == "cuda":
            self.buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            self.buffer.copy_(t, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.buffer = t

    def rows(self) -> list:
        if self.event is not None:
            t0 = time.perf_counter()
            self.event.synchronize()
            self.waited = time.perf_counter() - t0
        return self.buffer.tolist()


@dataclass
class LaunchedDecode:
    """One queued step of ``verification.sampling`` (each samples one token, nothing is drafted)."""

    verification: Verification
    read: HostRead
    clock: PhaseClock
    marks: tuple[Any, Any]     # the clock's marks around the target forward and the sampler

    def sampled_on_device(self, request_ids: list[str]) -> torch.Tensor:
        """[len(request_ids)] int64: the token this step sampled for each, still on the device."""
        v = self.verification
        row = {s.request.request_id: i for i, s in enumerate(v.sampling)}
        index = to_device([row[r] for r in request_ids], torch.int64, v.out.device)
        return v.out[:, 0].index_select(0, index)

    def collect(self) -> ModelRunnerOutput:
        """Wait for this step's tokens (not for work queued after it) and return its results."""
        results = self.verification.finish(self.read.rows())
        t0, t1 = self.marks
        return ModelRunnerOutput(results, self.clock.seconds(t0, t1), 0.0,
                                 host_wait_seconds=self.read.waited)
