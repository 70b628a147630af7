"""The loop of tensor-parallel ranks 1..tp-1.

A worker holds its shard of the target and its share of the target KV cache (its heads) and
nothing else: no scheduler, no tokenizer, no draft. Each step rank 0 broadcasts the step's
``ForwardItem``s; every rank builds the same inputs from them and runs its shard of the forward,
meeting the others in the all-reduces and the final all-gather of the logits. ``None`` ends the
loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specserve.engine.distributed.group import Rendezvous, TPGroup
from specserve.engine.models.spec import ModelSpec

log = logging.getLogger("specserve.tp")


@dataclass(frozen=True)
class WorkerArgs:
    """Everything a worker needs to build its shard (picklable: it crosses a process spawn)."""

    rdv: Rendezvous
    rank: int
    spec: ModelSpec
    device_type: str          # "cpu" | "cuda" (rank r uses cuda:r)
    dtype: torch.dtype
    kernel_backend: str
    max_positions: int        # RoPE table length
    load_format: str
    seed: int
    block_size: int
    num_threads: int


def device_of(device_type: str, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def worker_main(args: WorkerArgs) -> None:
    """Entry point of a spawned worker process."""
    from specserve.engine.models.loader import load_model
    from specserve.engine.runner.model_runner import KVLayout, allocate_kv
    from specserve.kernels.backend import set_backend

    logging.basicConfig(level=logging.WARNING, format=f"%(asctime)s tp{args.rank} %(name)s: %(message)s")
    torch.set_num_threads(args.num_threads)
    device = device_of(args.device_type, args.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    set_backend(args.kernel_backend)
    group = TPGroup(args.rdv, args.rank, device=device)
    model = load_model(args.spec, device, args.dtype, args.max_positions, args.load_format,
                       args.seed, group)
    num_blocks, bound = group.broadcast_object()     # TPDriver.start
    kv = allocate_kv(model.kv_spec, KVLayout(num_blocks, args.block_size, args.dtype, device))
    steps = run_steps(model, kv, group, args.block_size, device, bound)
    log.info("rank %d: stopped after %d forwards", args.rank, steps)


@torch.inference_mode()
def run_steps(model, kv, group: TPGroup, block_size: int, device: torch.device,
              bound: int | None) -> int:
    """Follow rank 0's forwards until it broadcasts None; returns how many ran."""
    from specserve.engine.runner.inputs import build_inputs

    steps = 0
    while True:
        items = group.broadcast_object()
        if items is None:
            return steps
        inputs = build_inputs(items, block_size, device, bound)
        hidden = model(inputs.input_ids, inputs.positions, inputs.meta, kv)
        if inputs.logits_indices.numel():          # rank 0 gathers the logits: join it
            model.compute_logits(hidden[inputs.logits_indices], rows=hidden.shape[0])
        steps += 1
