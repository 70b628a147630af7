"""StepStats (the per-step numbers the server exports as metrics) and prefix-cache accounting."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from specserve.engine.types import SamplingParams

MODEL = "qwen2"


def test_step_stats_account_for_every_token(make_llm, prompts, drive):
    llm = make_llm(MODEL, num_kv_blocks=10, max_num_batched_tokens=24, max_num_seqs=4)
    core = llm.core
    ps = prompts([30, 5, 41, 12, 22, 9], seed=40)
    ns = [10, 14, 6, 12, 9, 11]
    d = drive(core)
    rids = d.add_all(ps, [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in ns])
    run = d.until_done()
    for s in run.stats:
        assert 0 < s.num_scheduled_tokens <= 24
        assert s.num_running <= 4 and s.num_running + s.num_waiting <= len(ps)
        assert s.kv_cache_usage == pytest.approx(1.0 - s.num_free_blocks / core.kv.num_blocks)
        assert 0.0 <= s.kv_cache_usage <= 1.0 and s.step_seconds > 0
        assert s.draft_prob_bytes == 0
    assert run.stats[0].num_waiting == len(ps) - run.stats[0].num_running
    assert run.stats[-1].num_running == 0 and run.stats[-1].num_waiting == 0
    assert sum(s.num_generation_tokens for s in run.stats) == sum(ns)
    cached = sum(run.final[r].num_cached_prompt_tokens for r in rids)
    # recomputation after a preemption counts again; without preemption prompt tokens add up exactly
    prompt_tokens = sum(s.num_prompt_tokens for s in run.stats)
    if run.num_preemptions == 0:
        assert prompt_tokens == sum(map(len, ps)) - cached
    else:
        assert prompt_tokens >= sum(map(len, ps)) - cached
    assert run.num_preemptions == sum(run.final[r].outputs[0].times.num_preemptions for r in rids)


def test_step_stats_report_prefix_cache_hits(make_llm, prompts, drive):
    llm = make_llm(MODEL)
    shared = prompts([48], seed=41)[0]
    d = drive(llm.core)
    d.add("first", shared + [9], SamplingParams(max_tokens=2))
    d.until_done()
    d.add("second", shared + [11], SamplingParams(max_tokens=2))
    run = d.until_done()
    assert run.final["second"].num_cached_prompt_tokens == 48
    assert sum(s.num_prefix_cache_queries for s in run.stats) > 0
    assert sum(s.num_prefix_cache_hits for s in run.stats) > 0


def test_a_one_token_request_fills_the_prefix_cache(make_llm, prompts):
    llm = make_llm(MODEL)
    shared = prompts([48], seed=42)[0]
    llm.generate([shared + [9]], SamplingParams(max_tokens=1))
    [out] = llm.generate([shared + [11]], SamplingParams(max_tokens=1))
    assert out.num_cached_prompt_tokens == 48
