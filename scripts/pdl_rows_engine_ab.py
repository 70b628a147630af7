"""PDL's row rule for a large model (kernels/triton_pdl.LARGE_MODEL_ROWS) measured in the engine:
the dummy Qwen3-8B-like target alone and with the 0.6B-like draft at fixed k, each built twice
over the same loaded weights, once with the rule off (no large-model launch uses PDL) and once
with it on (the default), and stepped in alternating rounds in one process. One line per round
and engine: mean ms a step and the median step; then each configuration's median ratio. The
arms alternate off/on, then on/off (ABBA).

Greedy decoding of random prompts, ``ignore_eos``. Before timing, each arm's engine decodes a
fresh batch of the configuration's size, and the two arms' outputs must be token-identical (the
rule changes no result).

    PYTHONPATH=/tmp/site:$PWD python3 scripts/pdl_rows_engine_ab.py --configs plain:1,plain:4,pair4:1
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from specserve.bench import shapes
from specserve.bench.engines import ModelCache, free_device_memory, random_prompts
from specserve.engine.types import SamplingParams
from specserve.kernels import triton_pdl

RULE = {"off": range(0), "on": triton_pdl.LARGE_MODEL_ROWS}


PROMPT = 128             # prompt tokens of every request
MAX_MODEL_LEN = 1024


def _greedy(core, batch: int, n: int, tag: str) -> list[list[int]]:
    """``batch`` fresh requests decoded together for ``n`` tokens: their token ids."""
    prompts = random_prompts(batch, 64, core.info.vocab_size, 7)
    for i, p in enumerate(prompts):
        core.add_request(f"{tag}-{i}", p, SamplingParams(temperature=0.0, ignore_eos=True,
                                                          max_tokens=n))
    tokens: dict[str, list[int]] = {}
    while core.has_unfinished():
        outs, _ = core.step()
        for out in outs:
            tokens[out.request_id] = list(out.outputs[0].token_ids)
    return [tokens[f"{tag}-{i}"] for i in range(batch)]


def _fill(core, batch: int, tag: str) -> None:
    """``batch`` requests that decode as long as the context allows."""
    room = MAX_MODEL_LEN - PROMPT - core.runner.num_speculative_tokens - 1
    for i, p in enumerate(random_prompts(batch, PROMPT, core.info.vocab_size, 1)):
        core.add_request(f"{tag}-{i}", p, SamplingParams(temperature=0.0, ignore_eos=True,
                                                          max_tokens=room))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="plain:1,plain:4,pair4:1",
                    help="comma-separated ENGINE:BATCH, ENGINE one of plain (no draft) and pairK "
                         "(the 0.6B-like draft at fixed k = K)")
    ap.add_argument("--steps", type=int, default=100, help="timed steps per round and arm")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, alternating off/on and on/off (ABBA)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (a smoke run)")
    a = ap.parse_args()
    cuda = torch.cuda.is_available() and not a.tiny
    target_shape, draft_shape = ((shapes.QWEN3_8B_LIKE, shapes.QWEN3_06B_LIKE) if not a.tiny
                                 else (shapes.TINY_TARGET, shapes.TINY_DRAFT))
    tmp = Path(tempfile.mkdtemp(prefix="specserve-pdl-rows-"))
    target, draft = shapes.write_pair(tmp, target_shape, draft_shape)
    cache = ModelCache("cuda" if cuda else "cpu", "bfloat16" if cuda else "float32", "auto",
                       MAX_MODEL_LEN, False, 0)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    print(f"# PDL row rule in the engine: {target_shape.name} (+ {draft_shape.name}), "
          f"{torch.cuda.get_device_name() if cuda else 'cpu'}, {time.strftime('%F %T')}; "
          f"rule on = rows {RULE['on'].start}-{RULE['on'].stop - 1}", flush=True)
    summary = []
    for config in a.configs.split(","):
        engine, batch = config.split(":")
        batch, k = int(batch), int(engine[4:]) if engine.startswith("pair") else 0
        cores, outputs = {}, {}
        for arm, rows in RULE.items():
            triton_pdl.LARGE_MODEL_ROWS = rows
            cores[arm] = cache.core(str(target), str(draft) if k else None, k, batch * 100 + 16,
                                    "dummy", max_num_seqs=max(batch, 1))
            outputs[arm] = _greedy(cores[arm], batch, 48, f"check-{arm}")
            _fill(cores[arm], batch, arm)
            for _ in range(10):
                cores[arm].step()
        same = outputs["off"] == outputs["on"]
        print(f"== {config}: greedy outputs of {batch} requests, off / on token-identical: "
              f"{same}", flush=True)
        if not same:
            raise SystemExit(f"{config}: the row rule changed a greedy output")
        medians: dict[str, list[float]] = {arm: [] for arm in RULE}
        for r in range(a.rounds):
            for arm in (("off", "on") if r % 2 == 0 else ("on", "off")):   # ABBA: no arm always first
                triton_pdl.LARGE_MODEL_ROWS = RULE[arm]
                walls = []
                sync()
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    cores[arm].step()
                    sync()
                    walls.append(time.perf_counter() - t0)
                if len(cores[arm].scheduler.running) < batch:
                    raise SystemExit(f"{config} {arm}: a request finished inside the timed steps")
                med = statistics.median(walls)
                medians[arm].append(med)
                print(f"round {r} {config} rule {arm}: mean {1e3 * statistics.fmean(walls):.3f} "
                      f"ms/step, median {1e3 * med:.3f}", flush=True)
        off, on = statistics.median(medians["off"]), statistics.median(medians["on"])
        summary.append(f"| {config} | {1e3 * off:.3f} | {1e3 * on:.3f} | {off / on:.3f}x |")
        triton_pdl.LARGE_MODEL_ROWS = RULE["on"]
        cores = None
        free_device_memory(cache.device)
    print("\n| engine:batch | rule off (median ms/step) | rule on | off / on |\n|---|---|---|---|")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
