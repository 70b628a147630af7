"""A/B of two paged-attention kernels at batch-1..16 decode shapes, under CUDA-graph replay.

Usage (GPU): python scripts/attention_ab.py --other NAME=PATH [--other ...] [--out FILE.md]

Each cell captures one graph of ``--layers`` attention calls (like one forward's layers, each
launching its kernels as the engine's graphs do, ``max_seq_len`` = the graph's max_model_len)
and times its replays; the table gives microseconds per call of this tree's kernel and of each other
module, imported from a file (e.g. ``git show REV:kernels/triton_attention.py > old.py``) so all
run in one process, and the largest difference of their outputs from this tree's.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from specserve.bench.report import StreamedTable
from specserve.bench.timing import graph_us_per_call
from specserve.kernels import triton_attention as new_attention
from tests.kernels.layer_cases import make_paged_case

SHAPES = {"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)}


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(f"attention_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--other", action="append", default=[], metavar="NAME=PATH",
                   help="another triton_attention module to time beside this tree's")
    p.add_argument("--out", default=None, help="write the Markdown table here too")
    p.add_argument("--layers", type=int, default=36, help="calls per captured graph")
    p.add_argument("--replays", type=int, default=50, help="timed replays per cell")
    p.add_argument("--max-model-len", type=int, default=4096, help="the max_seq_len bound passed")
    a = p.parse_args()
    others = {name: _load(name, path) for name, path in (o.split("=", 1) for o in a.other)}
    head = (["shape", "batch", "context", "this tree us"] + [f"{n} us" for n in others]
            + [f"max abs diff {n}" for n in others])
    table = StreamedTable(head)
    for name, (hq, hk, d) in SHAPES.items():
        for batch in (1, 4, 16):
            for context in (128, 384, 1024, 4096):
                case = make_paged_case([1] * batch, [context] * batch, hq, hk, d, 16,
                                       torch.bfloat16, seed=batch + context, device="cuda")
                args = (case.q, case.k_cache, case.v_cache, case.block_tables,
                        case.query_start_loc, case.seq_lens, case.scale, 1, a.max_model_len)
                mine = new_attention.paged_attention(*args)
                row = [name, str(batch), str(context),
                       f"{graph_us_per_call(lambda: new_attention.paged_attention(*args), a.layers, a.replays):.2f}"]
                diffs = []
                for mod in others.values():
                    diffs.append((mod.paged_attention(*args).float() - mine.float()).abs().max().item())
                    row.append(f"{graph_us_per_call(lambda: mod.paged_attention(*args), a.layers, a.replays):.2f}")
                row += [f"{d:.2e}" for d in diffs]
                table.add(row)
    table.finish(a.out)


if __name__ == "__main__":
    sys.exit(main())
