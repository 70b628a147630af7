"""Where a speculative step's host time goes: cProfile over steady-state EngineCore steps.

    python -m specserve.bench.profile_step [--model demo --draft demo --k 4 --batch 1 --steps 60]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import torch

from specserve.engine import LLM, SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default="demo")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--random-prompts", action="store_true", help="random token ids (as the bench)")
    args = ap.parse_args()
    for k in (0, args.k):
        llm = LLM(args.model, draft_model=args.draft if k else None, num_speculative_tokens=k or None,
                  device=args.device, max_model_len=1024, load_format=args.load_format,
                  max_num_seqs=args.max_num_seqs, num_kv_blocks=64 * 80)
        core = llm.core
        rng = torch.Generator().manual_seed(0)
        for i in range(args.batch):
            prompt = (torch.randint(10, 4000, (128,), generator=rng).tolist() if args.random_prompts
                      else list(range(10, 138)))
            core.add_request(f"p{i}", prompt, SamplingParams(temperature=0, max_tokens=800,
                                                                          ignore_eos=True))
        for _ in range(8):
            core.step()
        prof = cProfile.Profile()
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        tokens = 0
        prof.enable()
        for _ in range(args.steps):
            _, stats = core.step()
            tokens += stats.num_generation_tokens
        prof.disable()
        sync()
        dt = time.perf_counter() - t0
        print(f"== k={k} batch={args.batch}: {dt / args.steps * 1e3:.2f} ms/step, {tokens / dt:.1f} tok/s")
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue()[-6000:])
        core.abort([f"p{i}" for i in range(args.batch)])
        del llm, core
        torch.cuda.empty_cache() if torch.cuda.is_available() else None


if __name__ == "__main__":
    main()
