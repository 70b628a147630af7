"""Speculative decoding through the engine: same outputs as plain decoding, under preemption at
every point of the draft/verify cycle, with chunked prefill, padded vocabularies, and every
sampling feature; refusals that must be loud.

The draft is a noisy copy of the target (tests/helpers/checkpoints.py: make_perturbed_copy), so
drafts are sometimes accepted and sometimes rejected, which is what exercises the rollback paths.
"""

from __future__ import annotations

import random

import pytest

from specserve.engine import SamplingParams
from specserve.engine.config import ConfigError
from specserve.engine.runner.verifier import MissingDraftProbsError
from tests.conftest import assert_engine_clean
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec_engine")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=7)
    return str(target), str(draft)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 300) for _ in range(rng.randrange(1, 70))] for _ in range(n)]


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _ids(outs) -> list[list[int]]:
    return [c.token_ids for o in outs for c in o.outputs]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_spec_equals_plain_for_a_batch_of_16(pair, make_llm, k):
    prompts = _prompts(16)
    plain = _ids(make_llm(pair[0]).generate(prompts, GREEDY))
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=k)
    outs = llm.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    stats = [c.spec_decode for o in outs for c in o.outputs]
    drafts = sum(s.num_draft_tokens for s in stats)
    accepted = sum(s.num_accepted_tokens for s in stats)
    assert 0 < accepted < drafts, "both acceptance and rejection must happen"


def test_greedy_spec_equals_plain_with_preemption_and_chunked_prefill(pair, make_llm):
    prompts = _prompts(16, seed=1)
    plain = _ids(make_llm(pair[0]).generate(prompts, GREEDY))
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4, num_kv_blocks=14,
                   max_num_batched_tokens=16)
    outs = llm.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    assert sum(c.times.num_preemptions for o in outs for c in o.outputs) > 0, "no preemption happened"


def _run_with_preemption_at_every_step(llm, prompts, params, victim_rng):
    """Step the engine, preempting a random running request (drafts pending or mid-prefill)
    after every step; returns outputs by request id."""
    core = llm.core
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", p, params[i])
    done = {}
    preempted_with_drafts = 0
    while core.has_unfinished():
        outputs, _ = core.step()
        for out in outputs:
            if out.finished:
                done[out.request_id] = out
        running = list(core.scheduler.running)
        if running and victim_rng.random() < 0.7:
            victim = victim_rng.choice(running)
            preempted_with_drafts += bool(victim.draft_token_ids)
            core.scheduler._preempt(victim)
            assert core.debug_state()["num_free_blocks"] >= 0
    assert_engine_clean(core)
    return done, preempted_with_drafts


def test_preemption_at_every_point_of_the_cycle_changes_nothing(pair, make_llm):
    """Greedy and seeded sampled requests give the same tokens whether or not they are preempted
    between drafting and verification (drafts and their probabilities survive; the KV is
    recomputed), and nothing leaks."""
    prompts = _prompts(10, seed=2)
    params = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True) if i % 2 else
              SamplingParams(temperature=0.9, top_p=0.95, seed=100 + i, max_tokens=20, ignore_eos=True)
              for i in range(len(prompts))]
    calm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    reference = {f"r{i}": o for i, o in enumerate(calm.generate(prompts, params))}
    stormy = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    done, with_drafts = _run_with_preemption_at_every_step(stormy, prompts, params, random.Random(3))
    assert with_drafts > 5, "the test must preempt requests that hold drafts"
    for rid, ref in reference.items():
        assert done[rid].outputs[0].token_ids == ref.outputs[0].token_ids, rid


def test_seeded_spec_output_does_not_depend_on_the_batch(pair, make_llm):
    alone = SamplingParams(temperature=1.0, seed=42, max_tokens=24, ignore_eos=True)
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    solo = llm.generate([[9, 8, 7, 6]], alone)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=0.7, seed=i, max_tokens=30, ignore_eos=True) for i in range(11)]
    crowd = llm.generate([[9, 8, 7, 6]] + _prompts(11, seed=4), [alone] + others)
    assert crowd[0].outputs[0].token_ids == solo


def test_spec_keeps_logprobs_stops_n_and_penalties(pair, make_llm):
    prompts = _prompts(6, seed=5)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=3,
                            presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2)
    plain = make_llm(pair[0]).generate(prompts, params)
    spec = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4).generate(prompts, params)
    for a, b in zip(plain, spec):
        ca, cb = a.outputs[0], b.outputs[0]
        assert ca.token_ids == cb.token_ids
        assert len(cb.logprobs) == len(cb.token_ids)
        for la, lb in zip(ca.logprobs, cb.logprobs):  # the target's logprobs at every position
            assert la.token_id == lb.token_id and abs(la.logprob - lb.logprob) < 1e-4
    text = make_llm(pair[0]).generate([prompts[0]], GREEDY)[0].outputs[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    assert stop
    stopped = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4).generate(
        [prompts[0]], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop]))
    assert stopped[0].outputs[0].text == text[:text.index(stop)]
    assert stopped[0].outputs[0].stop_reason == stop
    n4 = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=2).generate(
        [prompts[1]], SamplingParams(n=4, temperature=1.0, seed=3, max_tokens=12, ignore_eos=True))
    assert len({tuple(c.token_ids) for c in n4[0].outputs}) > 1


def test_k_shrinks_near_max_tokens(pair, make_llm):
    llm = make_llm(pair[0], draft_model=pair[0], num_speculative_tokens=5)  # self-draft: all accepted
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=7, ignore_eos=True))[0].outputs[0]
    assert len(out.token_ids) == 7 and out.finish_reason.value == "length"
    assert out.spec_decode.num_draft_tokens <= 6


def test_draft_with_a_padded_vocabulary_works(pair, make_llm, tmp_path):
    target, _ = pair
    draft = make_tiny_checkpoint(tmp_path / "padded_draft", "llama", seed=9, initializer_range=0.2,
                                 model_vocab_size=384)  # same tokenizer, wider embedding table
    prompts = _prompts(4, seed=6)
    plain = _ids(make_llm(target).generate(prompts, GREEDY))
    assert _ids(make_llm(target, draft_model=str(draft), num_speculative_tokens=3).generate(prompts, GREEDY)) == plain


def test_a_draft_with_another_tokenizer_is_refused_at_start(pair, tmp_path):
    from specserve.engine import LLM

    other = make_tiny_checkpoint(tmp_path / "other_tok", "llama", vocab_size=300)
    with pytest.raises(ConfigError, match="different tokenizer"):
        LLM(pair[0], draft_model=str(other), num_speculative_tokens=3, device="cpu")


def test_vllm_speculative_config_is_accepted(pair, make_llm):
    llm = make_llm(pair[0], speculative_config={"method": "draft_model", "model": pair[1],
                                                "num_speculative_tokens": 2})
    assert llm.core.info.num_speculative_tokens == 2 and llm.core.info.draft_model_path


def test_a_missing_draft_probability_row_is_an_error(pair, make_llm):
    # the rows are lost between two steps, so the second must not be queued before the first
    # returns, as async scheduling does
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3, async_scheduling=False)
    core = llm.core
    core.add_request("x", [5, 6, 7, 8], SamplingParams(temperature=1.0, seed=1, max_tokens=30, ignore_eos=True))
    core.step()  # prefill + first drafts
    req = core.scheduler.requests["x"]
    assert req.draft_token_ids and req.draft_probs is not None
    assert core.draft_prob_bytes() == req.draft_probs.numel() * 4
    req.draft_probs = None  # lose the rows
    with pytest.raises(MissingDraftProbsError):
        core.step()
    core.abort(["x"])


def test_greedy_draft_mode_stores_no_probabilities(pair, make_llm):
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3, draft_sample_method="greedy")
    core = llm.core
    core.add_request("g", [5, 6, 7], SamplingParams(temperature=1.0, seed=2, max_tokens=30, ignore_eos=True))
    core.step()
    req = core.scheduler.requests["g"]
    assert req.draft_token_ids and req.draft_probs is None and core.draft_prob_bytes() == 0
    core.abort(["g"])
