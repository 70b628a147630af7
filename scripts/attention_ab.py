"""A/B of two paged-attention kernels at batch-1..16 decode shapes, under CUDA-graph replay.

Usage (GPU): python scripts/attention_ab.py --old PATH_TO_OLD_MODULE.py [--out FILE.md]

Each cell captures one graph of ``--layers`` attention calls (like one forward's layers, each
launching its kernels as the engine's graphs do, ``max_seq_len`` = the graph's max_model_len)
and times its replays; the table gives microseconds per call. The old module is imported from a
file (e.g. ``git show REV:kernels/triton_attention.py > old.py``) so both run in one process.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

import torch

from specserve.kernels import triton_attention as new_attention
from tests.kernels.layer_cases import make_paged_case

SHAPES = {"qwen3-8b": (32, 8, 128), "qwen3-0.6b": (16, 8, 128)}


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_attention", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _per_call_us(fn, layers: int, replays: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(layers):
            fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="path of the old triton_attention module")
    p.add_argument("--out", default=None, help="write the Markdown table here too")
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--replays", type=int, default=50)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--split-tokens", default="128,256,512")
    a = p.parse_args()
    old = _load(a.old)
    split_tokens = [int(s) for s in a.split_tokens.split(",")]
    head = ["shape", "batch", "context", "old us"] + [f"new st={s} us" for s in split_tokens] + ["max |new - old|"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, (hq, hk, d) in SHAPES.items():
        for batch in (1, 4, 16):
            for context in (128, 384, 1024, 4096):
                case = make_paged_case([1] * batch, [context] * batch, hq, hk, d, 16,
                                       torch.bfloat16, seed=batch + context, device="cuda")
                args = (case.q, case.k_cache, case.v_cache, case.block_tables,
                        case.query_start_loc, case.seq_lens, case.scale, 1, a.max_model_len)
                want = old.paged_attention(*args)
                row = [name, str(batch), str(context),
                       f"{_per_call_us(lambda: old.paged_attention(*args), a.layers, a.replays):.2f}"]
                diff = 0.0
                for st in split_tokens:
                    got = new_attention.paged_attention(*args, split_tokens=st)
                    diff = max(diff, (got.float() - want.float()).abs().max().item())
                    row.append(f"{_per_call_us(lambda: new_attention.paged_attention(*args, split_tokens=st), a.layers, a.replays):.2f}")
                row.append(f"{diff:.2e}")
                lines.append("| " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        open(a.out, "w").write(text)


if __name__ == "__main__":
    sys.exit(main())
