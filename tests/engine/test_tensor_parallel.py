"""Tensor parallelism on CPU (gloo): the target split over 2 and 4 processes behaves as TP = 1.

The tiny checkpoints have 4 attention heads and 2 KV heads, so TP = 4 replicates each KV head on
two ranks; their vocabularies (320 tokens, 24 for the statistics pair) split evenly, and the
tied-embedding Qwen3 checks that the LM head reuses the vocabulary-parallel table.
Greedy output must be token-identical to TP = 1 in fp32 (the all-reduces change the order of the
sums, so logits agree to ~1e-5, not bit for bit; ties closer than that would be bad luck, and the
initializer_range=0.2 checkpoints have none on these prompts).
"""

from __future__ import annotations

import random

import pytest
import torch

from specserve.engine import LLM, SamplingParams
from specserve.engine.config import ConfigError, EngineConfig, SpeculativeConfig
from specserve.engine.runner.inputs import ForwardItem
from tests.engine.spec_oracle import Oracle, sequential_chi_square
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

MIXED_LENGTHS = [3, 70, 12, 16, 1, 33, 95, 17, 48, 5, 21, 31, 64, 9, 40, 26]


def _prompts(lengths, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 300) for _ in range(n)] for n in lengths]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def _ids(outs) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


@pytest.fixture
def make_tp(make_llm, request):
    """make_llm plus tensor_parallel_size; the worker processes are stopped after the test."""
    def make(model, tp, **kw):
        llm = make_llm(model, tensor_parallel_size=tp, **kw)
        if llm.core.runner.tp is not None:
            request.addfinalizer(llm.core.runner.tp.close)
        return llm
    return make


# TP = 4 on the tied Qwen3: KV-head replication and the tied vocabulary-parallel head at once
@pytest.mark.parametrize("name,tp", [("llama", 2), ("qwen3_tied", 4)])
def test_greedy_matches_tp1_under_preemption(name, tp, make_tp):
    prompts = _prompts(MIXED_LENGTHS, seed=4)
    params = [_greedy(8 + (5 * i) % 13) for i in range(len(prompts))]
    base = make_tp(name, 1, num_kv_blocks=16)
    llm = make_tp(name, tp, num_kv_blocks=16)
    assert llm.core.runner.tp.world_size == tp
    # the raw logits first: a prefill of three requests, every row
    items = [ForwardItem(p, 0, list(range(5 * i, 5 * i + 5)), len(p)) for i, p in enumerate(prompts[:3])]
    with torch.inference_mode():
        want = base.core.runner._forward("target", items)
        got = llm.core.runner._forward("target", items)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)
    plain = _ids(base.generate(prompts, params))
    outs = llm.generate(prompts, params)
    assert _ids(outs) == plain
    assert sum(c.times.num_preemptions for o in outs for c in o.outputs) > 0, "no preemption happened"


@pytest.fixture(scope="module")
def spec_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_spec")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=7)
    return str(target), str(draft)


@pytest.mark.parametrize("tp", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_greedy_speculation_matches_tp1_under_preemption(tp, spec_pair, make_tp):
    prompts = _prompts([7, 60, 22, 1, 45, 13, 30, 66], seed=1)
    plain = _ids(make_tp(spec_pair[0], 1).generate(prompts, _greedy(24)))
    llm = make_tp(spec_pair[0], tp, draft_model=spec_pair[1], num_speculative_tokens=4,
                  num_kv_blocks=10, max_num_batched_tokens=16)
    outs = llm.generate(prompts, _greedy(24))
    assert _ids(outs) == plain
    stats = [c.spec_decode for o in outs for c in o.outputs]
    assert 0 < sum(s.num_accepted_tokens for s in stats) < sum(s.num_draft_tokens for s in stats)
    assert sum(c.times.num_preemptions for o in outs for c in o.outputs) > 0, "no preemption happened"


PROMPT = (7, 12, 5, 9, 20, 3)


@pytest.mark.slow
def test_sampling_at_tp2_follows_the_target_distribution(tmp_path):
    """The exactness test of tests/engine/test_spec_exactness.py, smaller, with the target at TP = 2."""
    target = make_tiny_checkpoint(tmp_path / "target", "llama", seed=1, initializer_range=0.2,
                                  model_vocab_size=24)
    draft = make_perturbed_copy(target, tmp_path / "draft", noise=0.03, seed=3)
    llm = LLM(str(target), draft_model=str(draft), num_speculative_tokens=3, device="cpu",
              dtype="float32", max_num_seqs=256, max_num_batched_tokens=4096, speculative_k="fixed",
              tensor_parallel_size=2)
    try:
        sp = [SamplingParams(n=64, seed=10_000 * (r + 1), max_tokens=4, ignore_eos=True, temperature=1.0)
              for r in range(48)]
        outs = llm.generate([list(PROMPT)] * 48, sp)
    finally:
        llm.core.runner.tp.close()
    samples = [tuple(c.token_ids[:3]) for o in outs for c in o.outputs]
    drafts = sum(c.spec_decode.num_draft_tokens for o in outs for c in o.outputs)
    accepted = sum(c.spec_decode.num_accepted_tokens for o in outs for c in o.outputs)
    assert 0 < accepted < drafts
    oracle = Oracle(str(target))
    stat, dof, pval = sequential_chi_square(samples, PROMPT, lambda ctx: oracle.probs(ctx, 1.0))
    assert dof > 10
    assert pval > 1e-3, f"chi2={stat:.1f} dof={dof} p={pval:.2e}: not the target's distribution"


def test_configuration_refusals(tiny_checkpoint):
    with pytest.raises(ConfigError, match="tensor-parallel-size"):
        EngineConfig(tensor_parallel_size=0)
    with pytest.raises(ConfigError, match="tensor_parallel_size 2"):
        SpeculativeConfig.from_json('{"model": "d", "tensor_parallel_size": 2}')
    assert SpeculativeConfig.from_json('{"model": "d", "tensor_parallel_size": 1}').model == "d"
    with pytest.raises(ConfigError, match="does not split"):   # 4 heads over 3 ranks
        LLM(str(tiny_checkpoint("llama")), device="cpu", tensor_parallel_size=3)


def test_cli_flag():
    from specserve.server.cli import build_parser, engine_config

    args = build_parser().parse_args(["serve", "--model", "demo", "--tensor-parallel-size", "2"])
    assert engine_config(args).tensor_parallel_size == 2
