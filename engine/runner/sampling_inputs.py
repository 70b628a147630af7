"""Per-request sampling parameters as the [num_reqs] tensors the sampling kernels read."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from specserve.engine.request import Request
from specserve.engine.runner.transfer import to_device


def host_fields(reqs: list[Request], positions: list[int],
                force_greedy: bool = False) -> tuple[list[list[float]], list[list[int]]]:
    """The fields as host rows: fp32 [temperature, top_p, min_p] and int64 [top_k, seed,
    position], each a list over ``reqs`` (temperature 0 everywhere when ``force_greedy``)."""
    temps = [0.0 if force_greedy else r.params.temperature for r in reqs]
    floats = [temps, [r.params.top_p for r in reqs], [r.params.min_p for r in reqs]]
    ints = [[r.params.top_k for r in reqs], [r.seed for r in reqs], list(positions)]
    return floats, ints


@dataclass
class SamplingTensors:
    temperature: torch.Tensor   # [B] fp32, 0 = greedy
    top_k: torch.Tensor         # [B] int64, 0 = off
    top_p: torch.Tensor         # [B] fp32
    min_p: torch.Tensor         # [B] fp32
    seeds: torch.Tensor         # [B] int64
    positions: torch.Tensor     # [B] int64, output index of each request's first sampled row

    @staticmethod
    def build(reqs: list[Request], positions: list[int], device: torch.device,
              force_greedy: bool = False) -> "SamplingTensors":
        """Two host-to-device copies (the fp32 fields, the integer fields), rows viewed out."""
        float_rows, int_rows = host_fields(reqs, positions, force_greedy)
        # rows padded to a multiple of 4 entries, so that every row view starts 16-byte aligned
        # (the Triton sampler copies unaligned parameter rows rather than compile for them)
        n = len(reqs)
        pad = -n % 4
        floats = to_device([r + [0.0] * pad for r in float_rows], torch.float32, device)[:, :n]
        ints = to_device([r + [0] * pad for r in int_rows], torch.int64, device)[:, :n]
        return SamplingTensors(temperature=floats[0], top_k=ints[0], top_p=floats[1],
                               min_p=floats[2], seeds=ints[1], positions=ints[2])

    def shifted(self, offset: int) -> "SamplingTensors":
        """The same requests ``offset`` output positions later (draft pass j: offset j)."""
        return dataclasses.replace(self, positions=self.positions + offset) if offset else self

    def rows(self, index: torch.Tensor) -> "SamplingTensors":
        """The requests at ``index`` (a device int64 tensor), in that order."""
        return SamplingTensors(*(getattr(self, f.name).index_select(0, index)
                                 for f in dataclasses.fields(self)))
