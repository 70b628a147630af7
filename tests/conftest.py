"""Shared fixtures: tiny checkpoints built once per session, and engines that must end clean.

* ``tiny_checkpoint(name)`` -> Path of a tiny random HF checkpoint, built on first use (about
  2-3 s each) and shared by the whole session. Names: see :data:`CHECKPOINTS`.
* ``make_llm(model, **engine_kwargs)`` -> :class:`engine.LLM` on CPU in fp32 (unless told
  otherwise). After the test every engine it made is checked: no request left, the KV block pool
  fully free, no draft probabilities held. A leak fails the test that caused it.

Nothing here imports torch at module level, so ``tests/unit`` stays torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import specserve  # noqa: F401 (first: keeps the repository's kernels/ from shadowing the installed package of that name)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# name -> keyword arguments of tests.helpers.checkpoints.make_tiny_checkpoint.
# initializer_range=0.2 (HF's default is 0.02): at 0.02 the tiny models' attention is nearly
# uniform and their logits nearly flat, so a broken RoPE or attention would leave greedy output
# unchanged and top-2 logits sit 1e-4 apart; at 0.2 positions matter and ties are rare.
_INIT = dict(initializer_range=0.2)
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "llama": dict(arch="llama", **_INIT),
    "qwen2": dict(arch="qwen2", **_INIT),
    "qwen3": dict(arch="qwen3", **_INIT),
    # Qwen3 small models tie the LM head to the embeddings
    "qwen3_tied": dict(arch="qwen3", tie_word_embeddings=True, seed=1, **_INIT),
    # Llama 3.1-style frequency-dependent RoPE scaling; a short original context so it matters
    "llama_rope_llama3": dict(arch="llama", seed=2, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}, **_INIT),
    "qwen2_rope_linear": dict(arch="qwen2", seed=3, rope_scaling={"rope_type": "linear", "factor": 4.0},
                              **_INIT),
}


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``tiny_checkpoint("qwen3")`` -> checkpoint directory (built once per session, lazily)."""
    from tests.helpers.checkpoints import make_tiny_checkpoint

    root = tmp_path_factory.mktemp("tiny_ckpts")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            if name not in CHECKPOINTS:
                raise KeyError(f"unknown tiny checkpoint {name!r}; known: {sorted(CHECKPOINTS)}")
            built[name] = make_tiny_checkpoint(root / name, **CHECKPOINTS[name])
        return built[name]

    return get


def assert_engine_clean(core: Any) -> None:
    """The post-test invariant of an EngineCore: nothing held, nothing pending."""
    leftover = sorted(core.scheduler.requests)
    assert not leftover, f"requests still in the scheduler after the test: {leftover[:8]}"
    assert not core.has_unfinished(), "EngineCore still tracks unfinished requests"
    core.kv.pool.check_all_free()
    assert core.draft_prob_bytes() == 0, f"{core.draft_prob_bytes()} bytes of draft probabilities remain"


@pytest.fixture
def make_llm(tiny_checkpoint: Callable[[str], Path]):
    """Factory: ``make_llm("llama", num_kv_blocks=12, ...)``; a checkpoint name or a directory.

    ``draft_model`` may also be a checkpoint name.
    """
    from specserve.engine import LLM

    made: list[Any] = []

    def resolve(model: str | os.PathLike) -> str:
        return str(model) if str(model) not in CHECKPOINTS else str(tiny_checkpoint(str(model)))

    def make(model: str | os.PathLike, **kwargs: Any) -> Any:
        path = resolve(model)
        if kwargs.get("draft_model") is not None:
            kwargs["draft_model"] = resolve(kwargs["draft_model"])
            # tests of the speculation machinery want drafts every step; adaptive k has its own
            # tests (tests/engine/test_adaptive_k.py) and switches itself on where it is tested
            kwargs.setdefault("speculative_k", "fixed")
        kwargs.setdefault("device", "cpu")
        kwargs.setdefault("dtype", "float32")
        llm = LLM(model=path, **kwargs)
        made.append(llm)
        return llm

    yield make
    for llm in made:
        assert_engine_clean(llm.core)
