"""Batch-1 decode through the real engine, against the memory-bandwidth roofline.

roofline tokens/s = measured copy bandwidth / bytes one decode step must read (the weights).
The measured side is EngineCore.step() with a single greedy request (``ignore_eos``): the prefill
step and a few warm-up steps are excluded, then ``steps`` steady-state decode steps are timed
(each step ends with the host reading the sampled token, so wall time is the step's real cost).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from specserve.bench.engines import random_prompts, weight_bytes
from specserve.bench.timing import median
from specserve.engine.core import EngineCore
from specserve.engine.types import SamplingParams


@dataclass
class DecodeMeasurement:
    prompt_len: int
    warmup_steps: int
    steps: int
    seconds: float
    median_step_s: float
    min_step_s: float

    @property
    def tok_per_s(self) -> float:
        return self.steps / self.seconds

    def as_dict(self) -> dict:
        return {**asdict(self), "tok_per_s": self.tok_per_s}


def measure_decode(core: EngineCore, prompt_len: int, warmup_steps: int, steps: int,
                   seed: int = 0) -> DecodeMeasurement:
    """Steady-state batch-1 decode: one token per EngineCore.step(), timed after warm-up."""
    if core.runner.num_speculative_tokens:
        raise ValueError("measure plain decoding on an engine without a draft")
    prompt = random_prompts(1, prompt_len, core.info.vocab_size, seed)[0]
    rid = f"roofline-{seed}"
    core.add_request(rid, prompt, SamplingParams(temperature=0.0, ignore_eos=True,
                                                 max_tokens=warmup_steps + steps + 2))
    try:
        produced = 0
        while produced == 0:                       # prefill (chunked if long) -> first token
            _, stats = core.step()
            produced += stats.num_generation_tokens
        for _ in range(warmup_steps):
            core.step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            _, stats = core.step()
            times.append(time.perf_counter() - t0)
            if stats.num_generation_tokens != 1:
                raise RuntimeError(f"a decode step emitted {stats.num_generation_tokens} tokens, expected 1")
    finally:
        core.abort([rid])
    return DecodeMeasurement(prompt_len, warmup_steps, steps, sum(times), median(times), min(times))


def roofline_numbers(bandwidth_bytes_per_s: float, core: EngineCore, decode: DecodeMeasurement) -> dict:
    """Roofline tokens/s, measured tokens/s and their ratio for the engine's target model."""
    wb = weight_bytes(core.runner.target)
    roof = bandwidth_bytes_per_s / wb["bytes_per_decode_step"]
    return {**wb, "bandwidth_bytes_per_s": bandwidth_bytes_per_s, "roofline_tok_per_s": roof,
            "measured_tok_per_s": decode.tok_per_s, "fraction_of_roofline": decode.tok_per_s / roof,
            "median_step_s": decode.median_step_s,
            "achieved_bytes_per_s": wb["bytes_per_decode_step"] * decode.tok_per_s}
