"""Fixtures of the engine-core tests: the transformers oracle, prompts, and a step driver.

The oracle is Hugging Face ``transformers`` itself (fp32, CPU) on the same checkpoint directory
the engine loads. ``ignore_eos=True`` on our side is matched on the HF side by an end-of-sequence
id that can never be produced (``eos_token_id=vocab_size``), so neither side stops early and
neither side alters the logits.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from specserve.engine.types import RequestOutput, SamplingParams, StepStats  # noqa: E402


class HFOracle:
    """Reference generations and logits from transformers, cached per checkpoint and prompt."""

    def __init__(self, tiny_checkpoint: Callable[[str], Path]):
        self._ckpt = tiny_checkpoint
        self._models: dict[str, Any] = {}
        self._greedy: dict[tuple, list[int]] = {}

    def model(self, name: str, **config_overrides: Any):
        key = name + repr(sorted(config_overrides.items()))
        if key not in self._models:
            from transformers import AutoModelForCausalLM

            torch.manual_seed(0)
            self._models[key] = AutoModelForCausalLM.from_pretrained(
                str(self._ckpt(name)), dtype=torch.float32, **config_overrides).eval()
        return self._models[key]

    def vocab_size(self, name: str) -> int:
        return self.model(name).config.vocab_size

    @torch.inference_mode()
    def greedy(self, name: str, prompt: Sequence[int], n: int, respect_eos: bool = False,
               **config_overrides: Any) -> list[int]:
        """``generate(do_sample=False)`` for exactly ``n`` new tokens.

        respect_eos=False: EOS is an ordinary token (our ``ignore_eos=True``).
        respect_eos=True: ``min_new_tokens=n`` bans EOS (our ``min_tokens=n``).
        """
        key = (name, tuple(prompt), respect_eos, repr(sorted(config_overrides.items())))
        have = self._greedy.get(key)
        if have is None or len(have) < n:
            model = self.model(name, **config_overrides)
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            extra = (dict(min_new_tokens=n) if respect_eos
                     else dict(eos_token_id=model.config.vocab_size))
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=n, pad_token_id=0, **extra)
            have = out[0, len(prompt):].tolist()
            assert len(have) == n, f"HF produced {len(have)} tokens, wanted {n}"
            self._greedy[key] = have
        return have[:n]

    @torch.inference_mode()
    def logits(self, name: str, ids: Sequence[int]) -> torch.Tensor:
        """Raw next-token logits at every position of ``ids``: [len(ids), V] fp32."""
        x = torch.tensor([list(ids)], dtype=torch.long)
        return self.model(name)(x).logits[0].float()


@pytest.fixture(scope="session")
def hf(tiny_checkpoint: Callable[[str], Path]) -> HFOracle:
    return HFOracle(tiny_checkpoint)


def random_prompts(lengths: Sequence[int], seed: int, lo: int = 5, hi: int = 320) -> list[list[int]]:
    """Token-id prompts of the given lengths, ids in [lo, hi) (no special tokens), fixed seed."""
    rng = random.Random(seed)
    return [[rng.randrange(lo, hi) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="session")
def prompts() -> Callable[..., list[list[int]]]:
    return random_prompts


@dataclass
class Run:
    """Everything a driven EngineCore produced."""

    final: dict[str, RequestOutput] = field(default_factory=dict)
    history: dict[str, list[RequestOutput]] = field(default_factory=dict)
    stats: list[StepStats] = field(default_factory=list)

    def tokens(self, rid: str, index: int = 0) -> list[int]:
        return self.final[rid].outputs[index].token_ids

    @property
    def num_preemptions(self) -> int:
        return sum(s.num_preemptions for s in self.stats)


class Driver:
    """Submit requests to an EngineCore and step it to completion (bounded: no silent hangs)."""

    def __init__(self, core: Any):
        self.core = core
        self.run = Run()

    def add(self, rid: str, prompt: Sequence[int], params: SamplingParams) -> str:
        self.core.add_request(rid, list(prompt), params)
        return rid

    def add_all(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams],
                prefix: str = "r") -> list[str]:
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        return [self.add(f"{prefix}{i}", p, sp) for i, (p, sp) in enumerate(zip(prompts, plist))]

    def step(self) -> list[RequestOutput]:
        outs, stats = self.core.step()
        self.run.stats.append(stats)
        for o in outs:
            self.run.history.setdefault(o.request_id, []).append(o)
            if o.finished:
                self.run.final[o.request_id] = o
        return outs

    def until_done(self, max_steps: int = 5000, on_step: Callable[[int], None] | None = None) -> Run:
        for i in range(max_steps):
            if not self.core.has_unfinished():
                return self.run
            self.step()
            if on_step is not None:
                on_step(i)
        raise AssertionError(f"engine did not finish within {max_steps} steps: {self.core.debug_state()}")


@pytest.fixture
def drive() -> Callable[[Any], Driver]:
    """``drive(llm.core)`` -> a Driver; ``.add_all(...)`` then ``.until_done()``."""
    return Driver
