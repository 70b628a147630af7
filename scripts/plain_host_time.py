"""The host's share of a plain decode step at a large batch, on the CPU machine: a tiny target
(tests/helpers/checkpoints.py) decodes ``--batch`` greedy requests through ``EngineCore.step``
(final-only outputs, as ``LLM.generate`` asks), and each step's wall time less the model's
forward and the sampler's call (the work a GPU runs as kernels) is the host's. Medians over the
pure decode steps of each run, milliseconds a step, with the host parts that take most of it.

    python scripts/plain_host_time.py [--batch 256] [--runs 3] [--tokens 64]

Needs specserve installed (``pip install -e .``); it runs from any directory (the repository
root is not put on the import path: its ``kernels/`` folder would shadow the package of that
name that transformers imports).
"""
from __future__ import annotations

import argparse
import importlib.util
import collections
import random
import statistics
import tempfile
import time
from pathlib import Path

from specserve.engine import LLM, SamplingParams
from specserve.engine import core as engine_core
from specserve.engine import scheduler as engine_scheduler
from specserve.engine.heap import settle_after_startup
from specserve.engine.models import llama
from specserve.engine.runner import model_runner
from specserve.engine.runner import verifier

def _tiny_checkpoint_maker():
    """tests/helpers/checkpoints.py's ``make_tiny_checkpoint``, loaded from its file."""
    path = Path(__file__).resolve().parents[1] / "tests" / "helpers" / "checkpoints.py"
    spec = importlib.util.spec_from_file_location("_checkpoints", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_tiny_checkpoint


DEVICE_PARTS = ("model forward", "sampler call")   # what a GPU runs as kernels


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256, help="requests decoding together")
    p.add_argument("--runs", type=int, default=3, help="timed generations")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    a = p.parse_args()
    d = Path(tempfile.mkdtemp(prefix="plain-host-time-")) / "tiny"
    _tiny_checkpoint_maker()(d)
    llm = LLM(model=str(d), max_num_seqs=a.batch, max_model_len=512, seed=0)
    step_parts: collections.Counter = collections.Counter()

    def timed(owner, name: str, label: str) -> None:
        f = getattr(owner, name)

        def run(*args, **kwargs):
            t = time.perf_counter()
            try:
                return f(*args, **kwargs)
            finally:
                step_parts[label] += time.perf_counter() - t
        setattr(owner, name, run)

    timed(llama.LlamaFamilyModel, "forward", "model forward")
    timed(verifier.ops, "rejection_sample", "sampler call")
    timed(engine_scheduler.Scheduler, "update_from_output", "update_from_output")
    timed(model_runner, "start_verification", "start_verification (with the sampler call)")
    timed(model_runner, "build_inputs", "build_inputs")
    timed(engine_core.IncrementalDetokenizer, "add", "detokenizer")
    timed(verifier.Verification, "finish", "Verification.finish")
    rng = random.Random(0)
    prompts = [[rng.randrange(5, 300) for _ in range(16)] for _ in range(a.batch)]
    params = SamplingParams(temperature=0.0, max_tokens=a.tokens, ignore_eos=True)
    core = llm.core

    def generate(tag: str) -> list[tuple[float, float, collections.Counter]]:
        for i, prompt in enumerate(prompts):
            core.add_request(f"{tag}-{i}", prompt, params, final_only=True)
        steps = []
        while core.has_unfinished():
            step_parts.clear()
            t = time.perf_counter()
            _, stats = core.step()
            wall = time.perf_counter() - t
            if stats.num_generation_tokens == a.batch:   # a pure decode step
                device = sum(step_parts[k] for k in DEVICE_PARTS)
                steps.append((wall, wall - device, collections.Counter(step_parts)))
        return steps

    generate("warm")
    settle_after_startup()   # as the server and the bench do
    print(f"batch {a.batch}, {a.tokens} tokens a request; milliseconds a decode step (medians)")
    for r in range(a.runs):
        steps = generate(f"run{r}")
        host = statistics.median(h for _, h, _ in steps)
        parts = {k: statistics.median(c[k] for _, _, c in steps) for k in steps[0][2]}
        print(f"run {r}: {len(steps)} steps, wall {statistics.median(w for w, _, _ in steps) * 1e3:.2f}, "
              f"host {host * 1e3:.2f} | " + ", ".join(
                  f"{k} {v * 1e3:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
                  if k not in DEVICE_PARTS), flush=True)


if __name__ == "__main__":
    main()
