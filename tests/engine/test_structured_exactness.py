"""Structured outputs keep speculative decoding exact: under a grammar, sampled output follows
the target's *constrained* distribution (softmax over the tokens the grammar allows), with the
draft proposing inside the grammar.

The pair is the one of test_spec_exactness (a 24-token model vocabulary: ids 5..23 are the
characters ``!"#$%&'()*+,-./0123``). The grammar ``([0-3][!-']){4,}`` alternates a digit (ids 20..23)
and one of ``!"#$%&'`` (ids 5..11), so the mask of verification row j depends on how many
drafts come before it: a verifier that masked every row with the committed state would be wrong
from row 1 on. The oracle computes the allowed sets by position parity, independently of the
grammar engine. Tolerance: chi-square p-value threshold 1e-3 with fixed seeds, as in
test_spec_exactness.
"""

from __future__ import annotations

import pytest
import torch

from specserve.engine import LLM, SamplingParams
from specserve.engine.runner import verifier
from specserve.engine.runner.logits import RowContext
from specserve.engine.structured import StructuredOutputs
from tests.engine.spec_oracle import Oracle, processed_probs, sequential_chi_square
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

PROMPT = (7, 12, 5, 9, 20, 3)
K = 3
P_THRESHOLD = 1e-3
GRAMMAR = StructuredOutputs(regex="([0-3][!-']){4,}")  # no end (EOS) before 8 tokens
DIGITS = list(range(20, 24))
SYMBOLS = list(range(5, 12))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured_pair")
    target = make_tiny_checkpoint(root / "target", "llama", seed=1, initializer_range=0.2,
                                  model_vocab_size=24)
    draft = make_perturbed_copy(target, root / "draft", noise=0.03, seed=3)
    return str(target), str(draft)


@pytest.fixture(scope="module")
def target(pair):
    return Oracle(pair[0])


def constrained_probs(oracle: Oracle, ctx: tuple[int, ...], temperature: float, top_p: float = 1.0):
    """The target's next-token distribution restricted to the grammar's tokens at this position."""
    allowed = DIGITS if (len(ctx) - len(PROMPT)) % 2 == 0 else SYMBOLS
    logits = oracle.logits([ctx])[0].clone()
    masked = torch.full_like(logits, float("-inf"))
    masked[allowed] = logits[allowed]
    return processed_probs(masked, temperature, 0, top_p)


def _sample(pair, num_requests: int, n: int, length: int, k: int = K, **params):
    # fixed k: seeded sampled requests would be pinned to k = 0 by adaptive k (no drafts to test)
    kw = dict(draft_model=pair[1], num_speculative_tokens=k, speculative_k="fixed") if k else {}
    llm = LLM(pair[0], device="cpu", max_num_seqs=256, max_num_batched_tokens=4096, **kw)
    sp = [SamplingParams(n=n, seed=7_000 * (r + 1), max_tokens=length + 1, structured_outputs=GRAMMAR,
                         **params) for r in range(num_requests)]
    outs = llm.generate([list(PROMPT)] * num_requests, sp)
    llm.core.kv.pool.check_all_free()
    samples = [tuple(c.token_ids[:length]) for o in outs for c in o.outputs]
    drafts = sum(c.spec_decode.num_draft_tokens for o in outs for c in o.outputs)
    accepted = sum(c.spec_decode.num_accepted_tokens for o in outs for c in o.outputs)
    return samples, drafts, accepted


CASES = [dict(temperature=1.0), dict(temperature=1.5, top_p=0.9)]


@pytest.mark.parametrize("params", CASES, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_constrained_speculative_samples_follow_the_constrained_target(pair, target, params):
    samples, drafts, accepted = _sample(pair, 64, 64, 4, **params)
    assert drafts > 0 and 0 < accepted < drafts, "both acceptance and rejection must happen"
    for s in samples:   # every sample is inside the grammar
        assert all(t in (DIGITS if i % 2 == 0 else SYMBOLS) for i, t in enumerate(s)), s
    stat, dof, pval = sequential_chi_square(
        samples, PROMPT, lambda ctx: constrained_probs(target, ctx, params["temperature"],
                                                       params.get("top_p", 1.0)))
    assert dof > 20
    assert pval > P_THRESHOLD, f"chi2={stat:.1f} dof={dof} p={pval:.2e}: not the constrained target"


def test_the_test_catches_verification_rows_masked_with_the_committed_state(pair, target, monkeypatch):
    """Break one thing: verification rows see only the committed outputs (not the drafts before
    them), so row j >= 1 gets row 0's mask. Drafts are still masked correctly. It must fail."""
    monkeypatch.setattr(verifier, "RowContext",
                        lambda request, generated: RowContext(request, request.output_token_ids))
    samples, _, _ = _sample(pair, 64, 64, 4, temperature=1.0)
    stat, dof, pval = sequential_chi_square(samples, PROMPT,
                                            lambda ctx: constrained_probs(target, ctx, 1.0))
    assert pval < P_THRESHOLD, f"broken verification masks passed (chi2={stat:.1f} dof={dof} p={pval:.2e})"


def test_acceptance_stays_high_under_the_grammar(pair):
    """The draft proposes inside the grammar, so acceptance per drafted token under the grammar
    is not lower than without it (here it is higher: the grammar removes most of the mass on
    which target and draft disagree)."""
    _, d_free, a_free = _sample_free(pair)
    _, d_con, a_con = _sample(pair, 16, 16, 6, temperature=1.0)
    assert a_con / d_con >= a_free / d_free - 0.02, (a_con / d_con, a_free / d_free)


def _sample_free(pair):
    llm = LLM(pair[0], draft_model=pair[1], num_speculative_tokens=K, speculative_k="fixed", device="cpu",
              max_num_seqs=256)
    sp = [SamplingParams(n=16, seed=7_000 * (r + 1), max_tokens=7, ignore_eos=True, temperature=1.0)
          for r in range(16)]
    outs = llm.generate([list(PROMPT)] * 16, sp)
    drafts = sum(c.spec_decode.num_draft_tokens for o in outs for c in o.outputs)
    accepted = sum(c.spec_decode.num_accepted_tokens for o in outs for c in o.outputs)
    return None, drafts, accepted
