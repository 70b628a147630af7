"""Scheduler: token budget, chunking, the verification region, preemption and admission (no torch).

The model is replaced by :func:`apply`, which makes up a runner's result (accepted drafts, one
more token, new drafts) and commits it through ``Scheduler.update_from_output``, as EngineCore
does: advance ``num_computed_tokens``, roll back rejected drafts, append the tokens, commit full
blocks to the prefix cache, and finish at max_tokens.
"""

from __future__ import annotations

import random

import pytest

from specserve.engine.batch import ModelRunnerOutput, RequestResult, SchedulerOutput
from specserve.engine.kv_cache import KVCacheManager
from specserve.engine.request import Request, RequestStatus
from specserve.engine.scheduler import Scheduler, SchedulerLimits
from specserve.engine.types import FinishReason, SamplingParams, StepStats

BS = 4
TOKEN = 7


def make(num_blocks: int, budget: int = 64, max_seqs: int = 8, k: int = 0) -> Scheduler:
    return Scheduler(SchedulerLimits(max_seqs, budget, 1024, k), KVCacheManager(num_blocks, BS))


def req(rid: str, prompt_len: int, max_tokens: int = 4, first: int = 100) -> Request:
    prompt = [first + i for i in range(prompt_len)]
    return Request(rid, prompt, SamplingParams(max_tokens=max_tokens), 0, (0,), max_tokens, 0.0)


def apply(sched: Scheduler, so: SchedulerOutput, accept: int | None = None, drafts: int = 0) -> None:
    """Commit ``so`` through ``Scheduler.update_from_output`` as if a model had run: ``accept``
    drafts are accepted (default all), then one more token; ``drafts`` new drafts are proposed
    (at most ``k_next``); a request finishes at max_tokens."""
    out = ModelRunnerOutput()
    for s in so.scheduled:
        r = s.request
        end = s.num_computed_before + s.num_new_tokens
        res = out.results[r.request_id] = RequestResult(num_draft_computed=end)
        if s.samples:
            a = s.k if accept is None else min(accept, s.k)
            res.sampled = r.draft_token_ids[:a] + [TOKEN]
            res.new_drafts = [TOKEN + 1] * min(drafts, s.k_next)

    def append_tokens(r: Request, res: RequestResult) -> None:
        r.token_ids.extend(res.sampled[:r.max_tokens - r.num_output_tokens])
        if r.num_output_tokens >= r.max_tokens:
            sched.finish(r, FinishReason.LENGTH)

    sched.update_from_output(so, out, StepStats(), append_tokens)


def abort(sched: Scheduler, *request_ids: str) -> list[Request]:
    """What EngineCore.abort does to the scheduler: finish each known request with ABORT."""
    found = [sched.requests[rid] for rid in request_ids if rid in sched.requests]
    for r in found:
        sched.finish(r, FinishReason.ABORT)
    return found


def idle(sched: Scheduler) -> bool:
    return not (sched.waiting or sched.running)


def shape(so: SchedulerOutput) -> list[tuple[str, int, bool]]:
    return [(s.request.request_id, s.num_new_tokens, s.samples) for s in so.scheduled]


def run_all(sched: Scheduler, max_steps: int = 500, **kw) -> list[SchedulerOutput]:
    outs = []
    for _ in range(max_steps):
        if idle(sched):
            return outs
        so = sched.schedule()
        assert so.num_scheduled_tokens <= sched.limits.max_num_batched_tokens
        assert len(sched.running) <= sched.limits.max_num_seqs
        apply(sched, so, **kw)
        outs.append(so)
    raise AssertionError(f"no progress after {max_steps} steps: {sched.running} {list(sched.waiting)}")


# ---- budget and chunking --------------------------------------------------------------------

def test_token_budget_chunks_prefill_and_mixes_it_with_decodes():
    s = make(64, budget=16)
    a, b, c = req("a", 10), req("b", 20), req("c", 30)
    for r in (a, b, c):
        s.add(r)
    so = s.schedule()
    assert shape(so) == [("a", 10, True), ("b", 6, False)]        # c waits: budget spent
    apply(s, so)
    so = s.schedule()
    assert shape(so) == [("a", 1, True), ("b", 14, True), ("c", 1, False)]
    apply(s, so)
    run_all(s)
    assert not s.requests and not s.running and not s.waiting
    s.kv.pool.check_all_free()


def test_max_num_seqs_caps_the_running_set():
    s = make(64, max_seqs=2)
    rs = [req(f"r{i}", 3, max_tokens=3) for i in range(3)]
    for r in rs:
        s.add(r)
    so = s.schedule()
    assert [x.request.request_id for x in so.scheduled] == ["r0", "r1"]
    assert rs[2].status == RequestStatus.WAITING
    outs = run_all(s)
    assert all(len(o.scheduled) <= 2 for o in outs)
    s.kv.pool.check_all_free()


def test_blocks_cover_the_next_drafts():
    s = make(64, k=2)
    r = req("a", 4)
    s.add(r)
    so = s.schedule()
    assert so.scheduled[0].k_next == 2
    assert len(r.block_ids) == 2                                  # 4 tokens + 2 drafts > 1 block
    apply(s, so, drafts=2)
    assert r.draft_token_ids == [TOKEN + 1] * 2
    so = s.schedule()
    assert shape(so) == [("a", 3, True)] and so.scheduled[0].k == 2
    abort(s, "a")


def test_update_from_output_rolls_back_rejected_drafts_and_keeps_the_new_ones():
    s = make(64, k=3)
    r = req("a", 4, max_tokens=20)
    s.add(r)
    apply(s, s.schedule(), drafts=3)                  # prefill: 1 token, 3 drafts proposed
    assert (r.num_output_tokens, r.draft_token_ids) == (1, [TOKEN + 1] * 3)
    so = s.schedule()
    sr = so.scheduled[0]
    assert (sr.num_new_tokens, sr.k) == (4, 3)        # last token + 3 drafts
    out = ModelRunnerOutput({"a": RequestResult(sampled=[TOKEN + 1, 99], new_drafts=[5, 6],
                                                new_draft_probs="q", num_draft_computed=6,
                                                num_draft_kv_ahead=1)})
    stats = StepStats()
    seen = []
    s.update_from_output(so, out, stats, lambda req_, res: (seen.append(list(res.sampled)),
                                                            req_.token_ids.extend(res.sampled)))
    assert sr.num_accepted == 1 and seen == [[TOKEN + 1, 99]]
    # the step computed KV for positions 4..7 (the sampled token + 3 drafts); 2 drafts rejected
    assert r.num_computed_tokens == 4 + 4 - 2
    assert (r.draft_token_ids, r.draft_probs) == ([5, 6], "q")
    assert (r.num_draft_computed, r.num_draft_kv_ahead) == (6, 1)
    assert (stats.spec_decode.num_drafts, stats.spec_decode.num_draft_tokens,
            stats.spec_decode.num_accepted_tokens) == (1, 3, 1)
    assert r.spec_stats.accepted_per_pos[:2] == [1, 0]
    abort(s, "a")


def test_update_from_output_keeps_no_drafts_of_a_finished_request():
    s = make(64, k=2)
    r = req("a", 4, max_tokens=2)
    s.add(r)
    apply(s, s.schedule(), drafts=2)
    apply(s, s.schedule(), drafts=2)                  # reaches max_tokens
    assert r.is_finished and r.draft_token_ids == [] and r.draft_probs is None
    assert "a" not in s.requests
    s.kv.pool.check_all_free()


def test_budget_must_hold_a_verification():
    with pytest.raises(ValueError):
        make(8, budget=3, k=3)


def _with_drafts(s: Scheduler, prompt_len: int, computed: int, num_drafts: int) -> Request:
    """A running request with ``computed`` tokens of KV and ``num_drafts`` pending drafts."""
    r = req("d", prompt_len, max_tokens=50)
    r.token_ids.append(TOKEN)                                     # one committed output token
    r.draft_token_ids = [TOKEN + 1] * num_drafts
    r.num_computed_tokens = computed
    r.status = RequestStatus.RUNNING
    assert s.kv.allocate(r, computed)
    s.requests[r.request_id] = r
    s.running.append(r)
    return r


def test_verification_region_is_never_split_by_the_budget():
    rng = random.Random(0)
    for _ in range(300):
        prompt_len, k = rng.randint(1, 30), rng.randint(1, 4)
        s = make(64, budget=rng.randint(k + 1, 40), k=k)
        n_tok = prompt_len + 1
        computed = rng.randint(0, n_tok - 1)
        r = _with_drafts(s, prompt_len, computed, rng.randint(1, k))
        verify_start = n_tok - 1                                  # the last committed token
        so = s.schedule()
        n = so.scheduled[0].num_new_tokens if so.scheduled else 0
        end = computed + n
        assert end <= verify_start or end == r.num_tokens_with_drafts, (computed, n, r)
        if end == r.num_tokens_with_drafts:
            assert so.scheduled[0].samples and so.scheduled[0].k == len(r.draft_token_ids)


def test_a_verification_that_does_not_fit_waits_for_the_next_step():
    s = make(64, budget=5, k=3)
    other = req("o", 2, max_tokens=20)
    s.add(other)
    apply(s, s.schedule())                                        # o is running, decoding
    d = _with_drafts(s, 8, 8, 3)                                  # needs 4 tokens to verify
    so = s.schedule()                                             # o takes 1 + its drafts? none
    assert shape(so) == [("o", 1, True), ("d", 4, True)]
    apply(s, so, accept=0)
    assert d.num_computed_tokens == 9 and d.num_output_tokens == 2
    d.draft_token_ids = [1, 2, 3]
    other.draft_token_ids = [4, 5, 6]
    so = s.schedule()                                             # o verifies 4, d cannot fit 4 in 1
    assert shape(so) == [("o", 4, True)]
    abort(s, "o", "d")
    s.kv.pool.check_all_free()


# ---- preemption and admission ---------------------------------------------------------------

def test_preempts_the_most_recently_admitted_and_admits_nothing_that_step():
    s = make(4)                                                   # 16 slots
    a, b = req("a", 4, max_tokens=6), req("b", 12, max_tokens=2, first=500)
    s.add(a)
    s.add(b)
    apply(s, s.schedule())                                        # a: 1 block, b: 3 blocks
    assert s.kv.pool.num_free == 0
    late = req("late", 2, max_tokens=1, first=900)
    s.add(late)
    b.draft_token_ids = [1, 2]                                    # drafts survive a preemption
    so = s.schedule()                                             # a needs a 2nd block
    assert so.preempted == [b] and shape(so) == [("a", 1, True)]
    assert b.status == RequestStatus.WAITING and s.waiting[0] is b
    assert b.block_ids == [] and b.num_computed_tokens == 0 and b.times.num_preemptions == 1
    assert b.draft_token_ids == [1, 2]
    assert late.status == RequestStatus.WAITING, "admitted in a step that preempted"
    assert s.kv.pool.num_free == 2
    assert s.pop_preemption_count() == 1 and s.pop_preemption_count() == 0
    b.clear_drafts()
    apply(s, so)
    run_all(s)
    assert a.finish_reason == b.finish_reason == late.finish_reason == FinishReason.LENGTH
    s.kv.pool.check_all_free()


def test_a_request_that_cannot_grow_preempts_itself_last():
    s = make(4)
    a, b = req("a", 5, max_tokens=3), req("b", 8, max_tokens=3, first=500)
    s.add(a)
    s.add(b)
    apply(s, s.schedule())                                        # 2 + 2 blocks, pool full
    so = s.schedule()                                             # a fits, b needs a 3rd block
    assert shape(so) == [("a", 1, True)] and so.preempted == [b]
    apply(s, so)
    run_all(s)
    s.kv.pool.check_all_free()


def test_waiting_request_gives_back_its_claimed_prefix_when_it_cannot_be_admitted():
    s = make(6)
    first = req("first", 8, max_tokens=2)                         # computes and caches 2 blocks
    s.add(first)
    run_all(s)
    hog = req("hog", 12, max_tokens=8, first=700)                 # holds 3 blocks (+1 later)
    s.add(hog)
    apply(s, s.schedule())
    twin = req("twin", 16, max_tokens=2)                          # same first 8 tokens
    s.add(twin)
    free_before = s.kv.pool.num_free
    so = s.schedule()                                             # twin: 2 cached + 3 new > free
    assert [x.request.request_id for x in so.scheduled] == ["hog"]
    assert twin.status == RequestStatus.WAITING
    assert twin.block_ids == [] and twin.num_computed_tokens == 0
    assert s.kv.pool.num_free == free_before - 1                  # only hog's new block is gone
    apply(s, so)
    abort(s, "hog")
    so = s.schedule()                                             # now it fits, with its cache hit
    assert shape(so) == [("twin", 8, True)] and twin.num_cached_tokens == 8
    apply(s, so)
    run_all(s)
    s.kv.pool.check_all_free()


def test_small_pool_runs_everything_to_completion():
    rng = random.Random(1)
    s = make(10, budget=12, max_seqs=6, k=2)
    for i in range(20):
        s.add(req(f"r{i}", rng.randint(1, 20), max_tokens=rng.randint(1, 12), first=rng.choice([100, 300])))
    outs = run_all(s, max_steps=2000, accept=1, drafts=2)
    assert sum(len(o.preempted) for o in outs) > 0
    s.kv.pool.check_all_free()


# ---- membership -----------------------------------------------------------------------------

def test_finish_and_abort_free_everything_in_any_state():
    s = make(8, budget=4)
    run_, wait_ = req("run", 10, max_tokens=5), req("wait", 3)
    s.add(run_)
    s.add(wait_)
    apply(s, s.schedule())                                        # run is mid-prefill, wait waits
    assert run_.status == RequestStatus.RUNNING and wait_.status == RequestStatus.WAITING
    run_.draft_token_ids = [1]
    aborted = abort(s, "run", "wait", "nobody")
    assert [r.request_id for r in aborted] == ["run", "wait"]
    for r in aborted:
        assert r.finish_reason == FinishReason.ABORT and r.block_ids == [] and r.draft_token_ids == []
    s.finish(run_, FinishReason.STOP)                             # already finished: no-op
    assert run_.finish_reason == FinishReason.ABORT
    assert idle(s) and not s.requests
    s.kv.pool.check_all_free()


def test_capacity_error():
    s = make(4)
    assert s.capacity_error(16) is None
    msg = s.capacity_error(17)
    assert msg and "17 KV slots" in msg and "16 tokens" in msg
