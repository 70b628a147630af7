"""Synthetic requests through the real step path at start-up, so traffic meets no compiles.

The runner warms its eager forwards at fixed shapes (runner/warmup.py), but a server's first
requests also meet the sampler, the draft program and verification rows inside mixed steps at
batch sizes and widths no fixed list names. With the runner's warm-up alone, the first serve-load
run on a fresh H100 still stalled once at concurrency 16 (TTFT and ITL p99 about 700 ms; the
next runs: under 120 ms and 50 ms).

``run_startup_traffic`` sends a few waves of requests (1, 16, 64 and the batch limit at once,
some arriving while the others decode; half greedy, half sampled, each seeded so the engine's
own seed stream is untouched) and steps until all finish. It runs before the k controller exists
(so speculation drafts at k_max and nothing is learnt from these requests) and before any
listener or metric sees a step. Everything they took comes back: their KV blocks are freed (the
caller then starts from a fresh KV manager and scheduler: nothing of these requests stays in the
prefix cache, whose blocks the adaptive calibration is free to overwrite next).
"""

from __future__ import annotations

import logging
import random
import time
from typing import TYPE_CHECKING

from specserve.engine.types import ParamError, SamplingParams

if TYPE_CHECKING:
    from specserve.engine.core import EngineCore

log = logging.getLogger("specserve.engine")

_MAX_PROMPT = 160


def wave_sizes(max_num_seqs: int) -> list[int]:
    return sorted({1, min(16, max_num_seqs), min(64, max_num_seqs), max_num_seqs})


def run_startup_traffic(core: EngineCore, cuda_only: bool = True) -> int:
    """Run the waves on ``core`` (CUDA only unless ``cuda_only`` is False: nothing compiles on
    the CPU path); returns the number of steps taken."""
    if cuda_only and core.runner.device.type != "cuda":
        return 0
    if core.runner.tp is not None:   # the other ranks join the step loop only once serving
        return 0
    t0 = time.monotonic()
    info = core.info
    vocab = min(info.vocab_size, len(core.tokenizer))
    k = info.num_speculative_tokens
    out_len = min(2 * (k + 1) + 2, info.max_model_len - k - 3)   # a context this short: fewer
    longest = min(_MAX_PROMPT, info.max_model_len - out_len - k - 1)
    if out_len < 1 or longest < 2:
        return 0
    rng = random.Random(20261125)
    steps = sent = 0
    for n in wave_sizes(core.config.max_num_seqs):
        late = n // 4                       # arrive while the first ones decode: mixed steps
        for i in range(n - late):
            sent += _send(core, n, i, rng, vocab, longest, out_len)
        waited = 0
        while core.has_unfinished():
            core.step()
            steps += 1
            waited += 1
            if waited == 2:
                for i in range(n - late, n):
                    sent += _send(core, n, i, rng, vocab, longest, out_len)
    log.info("start-up traffic: %d requests in waves of %s, %d steps in %.1fs", sent,
             wave_sizes(core.config.max_num_seqs), steps, time.monotonic() - t0)
    return steps


def _send(core: EngineCore, wave: int, i: int, rng: random.Random, vocab: int, longest: int,
          out_len: int) -> int:
    """Add request ``i`` of the wave of ``wave`` requests; 1 if admitted, 0 if refused."""
    prompt = [rng.randrange(vocab) for _ in range(rng.randint(2, longest))]
    params = SamplingParams(temperature=0.0 if i % 2 == 0 else 1.0, max_tokens=out_len,
                            ignore_eos=True, seed=i)
    try:
        core.add_request(f"startup-{wave}-{i}", prompt, params)
    except ParamError:   # a cache too small for this prompt (CapacityError): the wave goes on
        return 0
    return 1
