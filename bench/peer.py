"""The peer: Hugging Face transformers ``generate(assistant_model=...)`` at batch 1.

Fixed k (``num_assistant_tokens = k``, schedule ``constant``) and the assistant's confidence stop
disabled (``assistant_confidence_threshold = 0``: transformers adds its ConfidenceCriteria only
for a threshold > 0, and fills in its default 0.4 only where the value is None). Greedy, the same
prompt and length as ours, EOS made unreachable (``eos_token_id = vocab_size``) so both sides
generate exactly ``output_len`` tokens. Both sides are timed end to end (prefill included).
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import torch

from specserve.bench.engines import random_prompts, run_generation
from specserve.bench.timing import median, synchronize
from specserve.engine.core import EngineCore

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def load_hf_pair(target_dir: str, draft_dir: str, device: torch.device, dtype: torch.dtype,
                 k: int) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, local_files_only=True)
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype, local_files_only=True)
    target, draft = target.to(device).eval(), draft.to(device).eval()
    gc = draft.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0
    return target, draft


def hf_generate(target: Any, draft: Any, prompt: list[int], output_len: int) -> list[int]:
    device = target.device
    ids = torch.tensor([prompt], dtype=torch.long, device=device)   # [1, prompt_len]
    vocab = target.config.vocab_size
    with torch.inference_mode():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                              do_sample=False, max_new_tokens=output_len, min_new_tokens=0,
                              eos_token_id=vocab, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _timed(fn: Callable[[], list[int]], device: torch.device, repeats: int) -> tuple[float, list[int]]:
    fn()                                   # warm-up (allocations, kernels)
    times, tokens = [], []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        tokens = fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return median(times), tokens


def _time_hf(target_dir: str, draft_dir: str, device: torch.device, dtype: torch.dtype, k: int,
             prompt: list[int], output_len: int, repeats: int) -> tuple[float, list[int]]:
    """transformers' models live only in this frame: freed when it returns."""
    target, draft = load_hf_pair(target_dir, draft_dir, device, dtype, k)
    return _timed(lambda: hf_generate(target, draft, prompt, output_len), device, repeats)


def compare_with_hf(core: EngineCore, target_dir: str, draft_dir: str, k: int, prompt_len: int,
                    output_len: int, repeats: int, seed: int = 0) -> dict:
    """Batch-1 tokens/s: ours (speculative, k) vs transformers assisted generation (same k)."""
    if core.runner.num_speculative_tokens != k:
        raise ValueError(f"our engine runs k={core.runner.num_speculative_tokens}, the comparison wants k={k}")
    device = core.runner.device
    dtype = core.runner.target_kv[0][0].dtype
    prompt = random_prompts(1, prompt_len, core.info.vocab_size, seed + 4242)[0]
    counter = iter(range(10**9))

    def ours() -> list[int]:
        return run_generation(core, [prompt], output_len, f"peer-{next(counter)}").outputs["0"]

    ours_s, ours_tokens = _timed(ours, device, repeats)
    hf_s, hf_tokens = _time_hf(target_dir, draft_dir, device, dtype, k, prompt, output_len, repeats)
    if len(hf_tokens) != output_len:
        raise RuntimeError(f"transformers produced {len(hf_tokens)} tokens, expected {output_len}")
    ours_tps, hf_tps = output_len / ours_s, output_len / hf_s
    prefix = next((i for i, (a, b) in enumerate(zip(ours_tokens, hf_tokens, strict=False)) if a != b), output_len)
    return {"k": k, "prompt_len": prompt_len, "output_len": output_len, "repeats": repeats,
            "ours_seconds": ours_s, "hf_seconds": hf_s, "ours_tok_per_s": ours_tps,
            "hf_tok_per_s": hf_tps, "ratio": ours_tps / hf_tps,
            "identical_tokens": ours_tokens == hf_tokens, "common_prefix": prefix,
            "dtype": str(dtype).replace("torch.", "")}
