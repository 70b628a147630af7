"""The speculator's parts on their own: the verifier against hand-written logits, the drafter
against the draft checkpoint run by transformers, and the runner's step order.

engine/runner/speculator.py runs verifier.py then drafter.py each step; the engine-level tests
(test_spec_engine.py, test_spec_exactness.py) check what comes out of whole generations. These
pin down each part, so that a failure says which one broke.
"""

from __future__ import annotations

import pytest

from specserve.engine import SamplingParams
from specserve.engine.batch import ScheduledRequest
from specserve.engine.request import Request
from specserve.engine.runner.verifier import MissingDraftProbsError, start_verification
from specserve.kernels.backend import set_backend
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

torch = pytest.importorskip("torch")

V = 16


def _verifying(rid: str, prompt: list[int], drafts: list[int], temperature: float = 0.0,
               probs=None) -> ScheduledRequest:
    """A request with one sampled token and ``drafts`` pending, scheduled to verify them."""
    req = Request(rid, prompt, SamplingParams(temperature=temperature, max_tokens=32), 0, (), 32, 0.0)
    req.token_ids.append(3)
    req.draft_token_ids, req.draft_probs = list(drafts), probs
    return ScheduledRequest(req, len(drafts) + 1, len(prompt), True, len(drafts), 0)


def _rows(argmaxes: list[int]) -> torch.Tensor:
    """Logits rows whose argmax is each of ``argmaxes``."""
    logits = torch.zeros(len(argmaxes), V)
    for i, t in enumerate(argmaxes):
        logits[i, t] = 5.0
    return logits


def test_greedy_verification_keeps_the_agreeing_prefix_then_the_targets_token():
    """(The Triton sampler's agreement with the torch one is tests/kernels' subject.)"""
    set_backend("torch")
    # a: the target agrees with drafts 1 and 2, not 3 -> [d1, d2, target's 3rd]
    # b: agrees with all -> [d1, d2, bonus]; c: nothing to verify -> [its token]
    a = _verifying("a", [1, 2], [7, 8, 9])
    b = _verifying("b", [4], [10, 11])
    c = _verifying("c", [5, 6, 7], [])
    logits = torch.cat([_rows([7, 8, 12, 13]), _rows([10, 11, 14]), _rows([15])])
    v = start_verification([a, b, c], logits, "probabilistic", False, torch.device("cpu"))
    results = v.finish(v.out.tolist())
    assert results["a"].sampled == [7, 8, 12]
    assert results["b"].sampled == [10, 11, 14]
    assert results["c"].sampled == [15]


def test_verification_refuses_drafts_without_their_probabilities():
    a = _verifying("a", [1, 2], [7, 8], temperature=1.0, probs=torch.full((1, V), 1 / V))  # 1 row, 2 drafts
    with pytest.raises(MissingDraftProbsError, match="2 drafts to verify but 1"):
        start_verification([a], _rows([7, 8, 9]), "probabilistic", True, torch.device("cpu"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("speculator")
    target = make_tiny_checkpoint(root / "target", "llama", seed=21, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.05, seed=22)
    return str(target), str(draft)


def test_every_stored_draft_is_the_draft_models_greedy_continuation(pair, make_llm, drive):
    """After every step, each request's pending drafts are what transformers' greedy decoding of
    the draft checkpoint gives from the committed tokens: the drafter's catch-up, KV rollback
    after rejections and the device program (here run eagerly) propose from the right state.
    A small KV pool forces preemptions: drafts proposed before one must still be right."""
    from transformers import AutoModelForCausalLM

    oracle = AutoModelForCausalLM.from_pretrained(pair[1], dtype=torch.float32).eval()
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3, num_kv_blocks=10,
                   block_size=4, max_num_batched_tokens=32)
    d = drive(llm.core)
    prompts = [[5 + (7 * i + 3 * j) % 200 for j in range(4 + 5 * i)] for i in range(3)]
    d.add_all(prompts, SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    checked = 0

    def check(_step: int) -> None:
        nonlocal checked
        for req in list(llm.core.scheduler.requests.values()):
            if not req.draft_token_ids:
                continue
            ids = torch.tensor([req.token_ids])
            with torch.inference_mode():
                out = oracle.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=len(req.draft_token_ids), pad_token_id=0,
                                      eos_token_id=oracle.config.vocab_size)
            assert req.draft_token_ids == out[0, ids.shape[1]:].tolist(), req
            checked += 1

    run = d.until_done(on_step=check)
    assert checked > 20 and run.num_preemptions > 0, (checked, run.num_preemptions)
