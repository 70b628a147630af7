"""Adaptive k through the engine: whatever k the controller picks, outputs stay exact.

* greedy output is token-identical to plain decoding with the controller deciding, with random
  k every step, and under preemption;
* strict verification emits the target's own sample at every position, so a seeded request's
  output is the plain output whatever k is chosen (random k, fixed k, none);
* under probabilistic verification the token at a position depends on whether a draft was
  verified there (min(1, p/q) acceptance cannot be coupled to plain sampling), so the adaptive
  controller pins seeded sampled requests to k = 0: their output is the plain output for their
  seed, in any batch and under preemption. With k forced as a function of the request alone
  their output depends on nothing else (batch, preemption);
* k = 0 for every request is plain decoding through the same path;
* a k decided one step ahead (while drafting, the controller decides step N + 2's k while the
  GPU runs N + 1) changes no token, and every verification reaches the acceptance model once.
"""

from __future__ import annotations

import random

import pytest

from specserve.engine import SamplingParams
from tests.engine.test_spec_engine import _ids, _prompts, _run_with_preemption_at_every_step
from tests.helpers.adaptive_k import force_k, force_random_k, script_k
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

K = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("adaptive_k")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=7)
    return str(target), str(draft)


def _spec(make_llm, pair, **kw):
    kw.setdefault("num_speculative_tokens", K)
    kw.setdefault("speculative_k", "adaptive")
    return make_llm(pair[0], draft_model=pair[1], **kw)


def _drafted(outs) -> int:
    return sum(c.spec_decode.num_draft_tokens for o in outs for c in o.outputs)


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def test_greedy_is_identical_with_the_controller_and_with_random_k(pair, make_llm):
    prompts = _prompts(12, seed=21)
    plain = _ids(make_llm(pair[0]).generate(prompts, GREEDY))
    llm = _spec(make_llm, pair)
    assert llm.core.spec_control.controller.cost is not None, "adaptive mode calibrates"
    assert _ids(llm.generate(prompts, GREEDY)) == plain
    force_random_k(llm.core, seed=3)
    outs = llm.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    assert _drafted(outs) > 0
    counts = llm.core.spec_control.controller.chosen_counts
    assert all(c > 0 for c in counts), f"every k in 0..{K} must have been chosen: {counts}"


def test_greedy_with_random_k_under_preemption_and_chunked_prefill(pair, make_llm):
    prompts = _prompts(16, seed=1)
    plain = _ids(make_llm(pair[0]).generate(prompts, GREEDY))
    llm = _spec(make_llm, pair, num_kv_blocks=14, max_num_batched_tokens=16)
    force_random_k(llm.core, seed=4)
    outs = llm.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    assert sum(c.times.num_preemptions for o in outs for c in o.outputs) > 0, "no preemption happened"


def test_k_zero_everywhere_is_plain_decoding(pair, make_llm):
    prompts = _prompts(6, seed=22)
    params = [SamplingParams(temperature=0.8, seed=50 + i, max_tokens=16, ignore_eos=True) for i in range(6)]
    plain = _ids(make_llm(pair[0]).generate(prompts, params))
    llm = _spec(make_llm, pair)
    force_k(llm.core, lambda row: 0)
    outs = llm.generate(prompts, params)
    assert _ids(outs) == plain and _drafted(outs) == 0


@pytest.mark.parametrize("drafts", ["sample", "greedy"])
def test_strict_seeded_output_does_not_depend_on_k_batch_or_preemption(pair, make_llm, drafts):
    prompts = _prompts(8, seed=23)
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=70 + i, max_tokens=20, ignore_eos=True)
              for i in range(8)]
    strict = dict(rejection_sample_method="strict", draft_sample_method=drafts)
    plain = _ids(make_llm(pair[0]).generate(prompts, params))
    fixed = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=K, speculative_k="fixed",
                     **strict)
    assert _ids(fixed.generate(prompts, params)) == plain
    llm = _spec(make_llm, pair, **strict)
    force_random_k(llm.core, seed=5)
    outs = llm.generate(prompts, params)
    assert _ids(outs) == plain and _drafted(outs) > 0
    solo = llm.generate([prompts[3]], params[3])
    assert _ids(solo)[0] == plain[3]
    # the controller's own choice: strict output does not depend on k, so seeded requests are
    # not pinned to k = 0 (whatever the draft method) and speculate with the batch
    free = _spec(make_llm, pair, **strict)
    ctl = free.core.spec_control.controller
    ctl.current, ctl.HYSTERESIS = K, 1e9      # keep the batch's k at K
    outs = free.generate(prompts, params)
    assert _ids(outs) == plain and all(c.spec_decode.num_draft_tokens > 0 for o in outs for c in o.outputs)
    stormy = _spec(make_llm, pair, **strict)
    force_random_k(stormy.core, seed=6)
    done, with_drafts = _run_with_preemption_at_every_step(stormy, prompts, params, random.Random(8))
    assert with_drafts > 0
    assert [done[f"r{i}"].outputs[0].token_ids for i in range(8)] == plain


def test_prefix_cache_hits_after_requests_held_at_k_zero(pair, make_llm, prompts):
    """A request that never drafted still fills the prefix cache (its draft KV is not written);
    a later request reusing those blocks catches the draft's KV up when it drafts, exactly, and
    from then on the blocks serve the draft too."""
    shared = prompts([48], seed=41)[0]
    tails = [[9, 10, 11], [12, 13], [14]]
    plain = _ids(make_llm(pair[0]).generate([shared + t for t in tails], GREEDY))
    llm = _spec(make_llm, pair)
    force_k(llm.core, lambda row: 0)
    [first] = llm.generate([shared + tails[0]], GREEDY)
    assert first.outputs[0].token_ids == plain[0] and _drafted([first]) == 0
    force_k(llm.core, lambda row: K)
    [second] = llm.generate([shared + tails[1]], GREEDY)
    assert second.num_cached_prompt_tokens == 48
    assert second.outputs[0].token_ids == plain[1] and _drafted([second]) > 0
    fresh = _spec(make_llm, pair)
    force_k(fresh.core, lambda row: K)
    [alone] = fresh.generate([shared + tails[1]], GREEDY)
    assert second.outputs[0].spec_decode == alone.outputs[0].spec_decode, \
        "the draft caught up on the shared blocks: it proposes as it would have with its own prefill"
    assert llm.core.kv.pool.draft_ready.count(True) >= 3, "the catch-up made the shared blocks ready"
    [third] = llm.generate([shared + tails[2]], GREEDY)
    assert third.num_cached_prompt_tokens == 48 and third.outputs[0].token_ids == plain[2]


def test_adaptive_pins_seeded_sampling_to_plain_output(pair, make_llm):
    """Probabilistic verification: seeded sampled requests decode plainly (k = 0) whatever the
    rest of the batch does, so their output is the one without a draft model, in a crowd of
    unseeded and greedy requests that do speculate, and under preemption."""
    prompts = _prompts(10, seed=24)
    seeded = [SamplingParams(temperature=0.9, seed=90 + i, max_tokens=20, ignore_eos=True) for i in range(5)]
    crowd = [SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)] * 3 + \
            [SamplingParams(temperature=0.7, max_tokens=20, ignore_eos=True)] * 2
    plain = _ids(make_llm(pair[0]).generate(prompts[:5], seeded))
    llm = _spec(make_llm, pair)
    force_k(llm.core, None)
    ctl = llm.core.spec_control.controller
    ctl.current, ctl.HYSTERESIS = K, 1e9      # keep the batch's k at K: the crowd speculates
    outs = llm.generate(prompts, seeded + crowd)
    assert _ids(outs)[:5] == plain
    assert all(c.spec_decode.num_draft_tokens == 0 for o in outs[:5] for c in o.outputs)
    assert sum(c.spec_decode.num_draft_tokens for o in outs[5:] for c in o.outputs) > 0
    stormy = _spec(make_llm, pair)
    done, _ = _run_with_preemption_at_every_step(stormy, prompts, seeded + crowd, random.Random(9))
    assert [done[f"r{i}"].outputs[0].token_ids for i in range(5)] == plain


def test_probabilistic_output_depends_only_on_the_requests_own_k_sequence(pair, make_llm):
    """k forced as a function of (seed, position): the same seeded output alone, in a crowd and
    under preemption at every step (the Philox keys are per position, not per batch row)."""
    def k_of(row) -> int:
        req = rows_by_id[row.request_id]
        return (req.seed * 7 + req.num_output_tokens * 3) % (K + 1)

    rows_by_id: dict = {}
    prompts = _prompts(8, seed=25)
    params = [SamplingParams(temperature=1.0, seed=110 + i, max_tokens=20, ignore_eos=True) for i in range(8)]

    def run(llm, prompts_, params_, storm=None):
        core = llm.core
        original = core.scheduler.add
        core.scheduler.add = lambda req: (rows_by_id.__setitem__(req.request_id, req), original(req))[1]
        force_k(core, k_of)
        if storm is None:
            return _ids(llm.generate(prompts_, params_))
        done, _ = _run_with_preemption_at_every_step(llm, prompts_, params_, storm)
        return [done[f"r{i}"].outputs[0].token_ids for i in range(len(prompts_))]

    together = run(_spec(make_llm, pair), prompts, params)
    alone = [run(_spec(make_llm, pair), [p], [sp])[0] for p, sp in zip(prompts[:3], params[:3])]
    assert alone == together[:3]
    assert run(_spec(make_llm, pair), prompts, params, random.Random(10)) == together


def _k_after(steps_at_zero: int, k: int):
    """A decision hook: k = 0 for the first ``steps_at_zero`` decisions, then ``k`` for every
    row (what the adaptive controller decides, with its ``current`` kept in step)."""
    from specserve.engine.spec_control import Decision

    calls = [0]

    def decide(ctl, rows):
        calls[0] += 1
        best = 0 if calls[0] <= steps_at_zero else k
        ctl.current = best
        return Decision([min(best, r.budget) for r in rows], best)

    return decide


def test_prompts_arriving_at_k_zero_skip_the_draft_and_are_caught_up_exactly(pair, make_llm):
    """While adaptive k sits at 0, prefill chunks do not run the draft model (on an H100 its
    eager forward cost 2-12 ms in every step a request arrived); the draft catches up on the
    whole prompt in the step it drafts again, and from then on proposes exactly what a draft
    that followed the prefill proposes (same drafts, same acceptance), with greedy output
    identical to plain decoding."""
    rng = random.Random(31)
    prompts = [[rng.randrange(5, 300) for _ in range(50)] for _ in range(4)]
    plain = _ids(make_llm(pair[0], max_num_batched_tokens=24).generate(prompts, GREEDY))

    held = _spec(make_llm, pair, max_num_batched_tokens=24)
    ctl = held.core.spec_control.controller
    decide = _k_after(6, K)
    ctl.decide = lambda rows: decide(ctl, rows)
    fed: list[int] = []
    drafter = held.core.runner.speculator.drafter
    forward = drafter.forward
    drafter.forward = lambda items: (fed.append(sum(len(it.token_ids) for it in items)), forward(items))[1]
    outs = held.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    assert _drafted(outs) > 0

    level = _spec(make_llm, pair, max_num_batched_tokens=24)
    steps = [0]

    def forced(row):       # the same k sequence, under the test hook: prefill chunks stay level
        return 0 if steps[0] <= 6 else K

    lc = level.core.spec_control.controller
    real_decide = lc.decide

    def counted(rows):
        steps[0] += 1
        return real_decide(rows)

    lc.decide = counted
    force_k(level.core, forced)
    ref = level.generate(prompts, GREEDY)
    assert [o.outputs[0].spec_decode for o in outs] == [o.outputs[0].spec_decode for o in ref]
    # prompts of 2-3 chunks: the held engine fed no prefill chunk to the draft, so its first
    # draft forward is the catch-up over every prompt at once (less the 2 tokens a row the
    # draft program itself feeds)
    assert fed and fed[0] >= sum(len(p) for p in prompts) - 2 * len(prompts)


def test_the_controller_sees_the_queue_that_waits_for_a_row(pair, make_llm):
    """The engine (scheduler path and decode-ahead alike) tells the controller how many requests
    wait for a row before it decides: a static batch's end is priced only when none does. Eight
    requests on four rows: the first steps see four waiting, the last none."""
    llm = _spec(make_llm, pair, max_num_seqs=4)
    ctl = llm.core.spec_control.controller
    seen = []
    hold, decide = ctl.hold_zero, ctl.decide
    ctl.hold_zero = lambda batch: seen.append(ctl.waiting) or hold(batch)
    ctl.decide = lambda rows: seen.append(ctl.waiting) or decide(rows)
    llm.generate(_prompts(8, seed=4), GREEDY)
    # the first four decode together for 24 tokens (decode-ahead continues them) while four wait
    assert seen[:16] == [4] * 16 and seen[-1] == 0 and set(seen) <= {0, 1, 2, 3, 4}


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_k_decided_one_step_ahead_keeps_greedy_exact_and_records_every_outcome_once(
        pair, make_llm, async_scheduling):
    """With async scheduling the controller decides while drafting one step ahead, off the path
    between a step's read and the next launch; without it (no step is queued) it decides when
    the step is planned. Either way greedy output is the target's, each verification is fed to
    the acceptance model exactly once, and nothing is kept for a finished request."""
    prompts = _prompts(10, seed=31)
    plain = _ids(make_llm(pair[0]).generate(prompts, GREEDY))
    llm = _spec(make_llm, pair, async_scheduling=async_scheduling)
    sc = llm.core.spec_control
    # k through 0 and back, then 3 to the end: a decision is made ahead for a step that never
    # comes (the batch drains), which the next run must not inherit
    script_k(llm.core, lambda n: (3, 1, 4, 2, 0, 4, 2)[n] if n < 7 else 3)
    fed = []
    record_step = sc.controller.acceptance.record_step
    sc.controller.acceptance.record_step = lambda verified: fed.extend(verified) or record_step(verified)
    outs = llm.generate(prompts, GREEDY)
    assert _ids(outs) == plain
    # per request: the verifications the acceptance model was fed are the request's own
    fed_by_request: dict[str, list[int]] = {}
    for request_id, _, k, accepted, _ in fed:
        if k > 0:
            sums = fed_by_request.setdefault(request_id, [0, 0, 0])
            sums[0], sums[1], sums[2] = sums[0] + 1, sums[1] + k, sums[2] + accepted
    own = {o.request_id: [o.outputs[0].spec_decode.num_drafts, o.outputs[0].spec_decode.num_draft_tokens,
                          o.outputs[0].spec_decode.num_accepted_tokens] for o in outs}
    assert fed_by_request == {rid: sums for rid, sums in own.items() if sums[0]} and fed_by_request
    # nothing is kept for finished requests, and no decision outlives its step
    assert not sc._unrecorded and not sc.controller.acceptance.per_request and sc._ahead is None
    if async_scheduling:
        assert sc.decided_ahead > 0, "drafting steps were not decided ahead"
    else:
        assert sc.decided_ahead == 0
    # a run that ends while drafting leaves no decision for a step that never came, and the
    # next run's first step follows the controller as it is then
    script_k(llm.core, lambda n: 3)
    llm.generate(prompts[:4], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert sc._ahead is None
    fed.clear()
    del sc.controller.decide, sc.controller.hold_zero   # script_k's: the controller's own again
    force_k(llm.core, lambda row: 1)
    outs = llm.generate(prompts[:4], GREEDY)
    assert _ids(outs) == plain[:4]
    assert fed and {v[2] for v in fed} == {1}
