"""Greedy decoding is token-identical to transformers' ``generate(do_sample=False)`` (fp32, CPU).

Covered: Llama, Qwen2, Qwen3, tied embeddings, llama3 and linear RoPE scaling; one request,
16 concurrent requests of mixed lengths, chunked prefill, prefix-cache hits and preemption
forced by a small block pool. Exact equality of token ids: no tolerance.

The scenarios share one set of 16 prompts so the (slow) HF oracle runs once per checkpoint.
"""

from __future__ import annotations

import pytest

from specserve.engine.types import FinishReason, SamplingParams

ALL = ["llama", "qwen2", "qwen3", "qwen3_tied", "llama_rope_llama3", "qwen2_rope_linear"]
BASE = ["llama", "qwen2", "qwen3"]
MIXED_LENGTHS = [3, 70, 12, 16, 1, 33, 95, 17, 48, 5, 21, 31, 64, 9, 40, 26]
MIXED_NEW = [8 + (5 * i) % 13 for i in range(16)]           # 8..20 new tokens, mixed
SHARED_LEN = 48                                            # three full blocks of 16
TAILS = [1, 9, 16, 23, 30, 4]


def _greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)


def _mixed(prompts) -> list[list[int]]:
    return prompts(MIXED_LENGTHS, seed=4)


def _check_all(hf, name, prompt_list, ns, run, rids) -> None:
    for p, n, rid in zip(prompt_list, ns, rids):
        out = run.final[rid].outputs[0]
        assert out.finish_reason == FinishReason.LENGTH
        assert out.token_ids == hf.greedy(name, p, n), f"{name} {rid} (prompt len {len(p)}) differs from HF"


def _run_mixed(name, make_llm, hf, prompts, drive, **engine_kwargs):
    llm = make_llm(name, **engine_kwargs)
    ps = _mixed(prompts)
    d = drive(llm.core)
    rids = d.add_all(ps, [_greedy(n) for n in MIXED_NEW])
    run = d.until_done()
    _check_all(hf, name, ps, MIXED_NEW, run, rids)
    return llm, run, rids


@pytest.mark.parametrize("name", ALL)
def test_single_request_matches_hf(name, make_llm, hf, prompts):
    llm = make_llm(name)
    prompt = prompts([57], seed=1)[0]
    [out] = llm.generate([prompt], _greedy(32))
    comp = out.outputs[0]
    assert comp.token_ids == hf.greedy(name, prompt, 32)
    assert comp.finish_reason == FinishReason.LENGTH


@pytest.mark.parametrize("name", BASE)
def test_min_tokens_matches_hf_min_new_tokens(name, make_llm, hf, prompts):
    """Our min_tokens bans EOS like HF's min_new_tokens (EOS left in force, not ignored)."""
    llm = make_llm(name)
    prompt = prompts([13], seed=2)[0]
    [out] = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=20, min_tokens=20))
    assert out.outputs[0].token_ids == hf.greedy(name, prompt, 20, respect_eos=True)


def test_rope_scaling_is_not_a_no_op(hf, prompts):
    """The scaled checkpoints really differ from their unscaled selves: the tests above have teeth."""
    prompt = prompts([57], seed=1)[0]
    for name in ("llama_rope_llama3", "qwen2_rope_linear"):
        plain = hf.greedy(name, prompt, 32, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        assert hf.greedy(name, prompt, 32) != plain, f"{name}: RoPE scaling changes nothing here"


@pytest.mark.parametrize("name", BASE)
def test_sixteen_concurrent_mixed_lengths(name, make_llm, hf, prompts, drive):
    _, run, _ = _run_mixed(name, make_llm, hf, prompts, drive)
    assert max(s.num_running for s in run.stats) == 16, "the 16 requests never ran together"
    assert run.num_preemptions == 0


@pytest.mark.parametrize("name", BASE)
def test_chunked_prefill(name, make_llm, hf, prompts, drive):
    budget = 12                                            # not a multiple of the block size
    _, run, _ = _run_mixed(name, make_llm, hf, prompts, drive, max_num_batched_tokens=budget)
    assert max(s.num_scheduled_tokens for s in run.stats) <= budget
    # prefill alone needs this many steps when no step exceeds the budget
    assert len(run.stats) >= sum(MIXED_LENGTHS) // budget
    # some step mixed prefill with decoding (prompt tokens and generated tokens together)
    assert any(s.num_prompt_tokens and s.num_generation_tokens > 1 for s in run.stats)


@pytest.mark.parametrize("name", BASE)
def test_preemption_small_pool(name, make_llm, hf, prompts, drive):
    # 16 blocks of 16 = 256 slots: about three of these requests at once (the longest needs 7)
    _, run, rids = _run_mixed(name, make_llm, hf, prompts, drive, num_kv_blocks=16)
    per_request = sum(run.final[r].outputs[0].times.num_preemptions for r in rids)
    assert run.num_preemptions > 0, "the small pool forced no preemption"
    assert per_request == run.num_preemptions
    assert max(s.kv_cache_usage for s in run.stats) > 0.9


def _prefix_prompts(prompts) -> tuple[list[list[int]], list[list[int]]]:
    shared = prompts([SHARED_LEN], seed=6)[0]
    round1 = [shared + t for t in prompts(TAILS, seed=7)]
    round2 = round1[:3] + [shared + t for t in prompts([3, 19], seed=8)] + [shared]
    return round1, round2


@pytest.mark.parametrize("name", BASE)
def test_prefix_cache_hits(name, make_llm, hf, prompts, drive):
    llm = make_llm(name)                                      # block size 16
    round1, round2 = _prefix_prompts(prompts)
    d = drive(llm.core)
    rids1 = d.add_all(round1, _greedy(12), prefix="a")
    _check_all(hf, name, round1, [12] * len(round1), d.until_done(), rids1)

    d2 = drive(llm.core)
    rids2 = d2.add_all(round2, _greedy(12), prefix="b")
    run2 = d2.until_done()
    _check_all(hf, name, round2, [12] * len(round2), run2, rids2)
    for p, rid in zip(round2, rids2):
        cached = run2.final[rid].num_cached_prompt_tokens
        # one prompt token is always computed, so the bare 48-token prefix gets 32 from the cache
        want = SHARED_LEN - 16 if len(p) == SHARED_LEN else SHARED_LEN
        assert want <= cached < len(p), f"{rid}: {cached} cached of {len(p)}, expected >= {want}"
    computed = sum(s.num_prompt_tokens for s in run2.stats)
    assert computed == sum(len(p) - run2.final[r].num_cached_prompt_tokens for p, r in zip(round2, rids2))


def test_preemption_chunking_and_prefix_cache_together(make_llm, hf, prompts, drive):
    """All the mechanisms at once: tiny budget, tiny pool, shared prefixes, mixed lengths."""
    name = "qwen3"
    llm = make_llm(name, num_kv_blocks=9, max_num_batched_tokens=8)
    round1, round2 = _prefix_prompts(prompts)
    ps = round1 + round2[3:5]
    d = drive(llm.core)
    rids = d.add_all(ps, _greedy(12))
    run = d.until_done()
    assert run.num_preemptions > 0
    assert max(s.num_scheduled_tokens for s in run.stats) <= 8
    assert any(run.final[r].num_cached_prompt_tokens > 0 for r in rids)
    _check_all(hf, name, ps, [12] * len(ps), run, rids)
