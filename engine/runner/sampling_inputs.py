"""Per-request sampling parameters as the [num_reqs] tensors the sampling kernels read."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request
from engine.runner.transfer import to_device


@dataclass
class SamplingTensors:
    temperature: torch.Tensor   # [B] fp32, 0 = greedy
    top_k: torch.Tensor         # [B] int32, 0 = off
    top_p: torch.Tensor         # [B] fp32
    min_p: torch.Tensor         # [B] fp32
    seeds: torch.Tensor         # [B] int64
    positions: torch.Tensor     # [B] int64, output index of each request's first sampled row

    @staticmethod
    def build(reqs: list[Request], positions: list[int], device: torch.device,
              force_greedy: bool = False) -> "SamplingTensors":
        def t(vals, dtype):
            return to_device(vals, dtype, device)

        temps = [0.0 if force_greedy else r.params.temperature for r in reqs]
        return SamplingTensors(
            temperature=t(temps, torch.float32),
            top_k=t([r.params.top_k for r in reqs], torch.int32),
            top_p=t([r.params.top_p for r in reqs], torch.float32),
            min_p=t([r.params.min_p for r in reqs], torch.float32),
            seeds=t([r.seed for r in reqs], torch.int64),
            positions=t(positions, torch.int64),
        )
