"""Decode-ahead (engine/decode_ahead.py, ``--async-scheduling``): the next plain step is queued
before the previous one's tokens are read. It must change no output and leak nothing.

Every test compares an engine with it on against the same engine with it off, token for token,
and checks that continuations were really queued (``num_ahead_steps``), so a test cannot pass
by the feature silently switching itself off. make_llm checks after each test that every KV
block came back and no request is left.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specserve.engine.spec_control import Calibration, CostModel  # noqa: E402
from specserve.engine.types import FinishReason, SamplingParams  # noqa: E402

MODEL = "qwen3"


def _prompts(n: int, length: int = 12, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 300, (length + i % 5,), generator=g).tolist() for i in range(n)]


def _mixed_params() -> list[SamplingParams]:
    """Greedy, seeded and unseeded sampling, top-k/p, stop tokens and strings, n > 1, logprobs."""
    return [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=7, max_tokens=19, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=20, top_p=0.9, max_tokens=30),
        SamplingParams(temperature=1.2, max_tokens=16, stop=["e", "a"]),
        SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=21, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, logprobs=3, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=11, max_tokens=40, stop_token_ids=[17, 33, 101]),
        SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True),
    ]


def _run(llm, prompts, params):
    """Per prompt, per completion: (token ids, finish reason, text, logprobs or None)."""
    outs = llm.generate(prompts, params)
    return [[(c.token_ids, c.finish_reason, c.text, c.logprobs) for c in o.outputs] for o in outs]


def _assert_same(a, b, atol=1e-5) -> None:
    """Tokens, finish reasons and text exactly; logprobs' ids exactly and values to ``atol``."""
    strip = [[(t, f, x) for t, f, x, _ in r] for r in a], [[(t, f, x) for t, f, x, _ in r] for r in b]
    assert strip[0] == strip[1]
    for ra, rb in zip(a, b):
        for (*_, la), (*_, lb) in zip(ra, rb):
            assert (la is None) == (lb is None)
            for x, y in zip(la or [], lb or []):
                assert x.token_id == y.token_id and abs(x.logprob - y.logprob) <= atol
                assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_output_is_unchanged_and_steps_really_run_ahead(make_llm):
    prompts = _prompts(8)
    params = _mixed_params()
    sync = make_llm(MODEL, async_scheduling=False, max_num_seqs=16)
    ahead = make_llm(MODEL, async_scheduling=True, max_num_seqs=16)
    assert sync.core.decode_ahead is None
    a, b = _run(sync, prompts, params), _run(ahead, prompts, params)
    _assert_same(a, b)
    assert any(c[3] for r in b for c in r), "the logprobs request returned none"
    assert ahead.core.decode_ahead.num_ahead_steps >= 20


def test_preemption_and_a_small_kv_pool(make_llm):
    """A pool too small for the batch: continuations are refused when blocks run short, the
    scheduler preempts, and the output still equals the synchronous engine's."""
    prompts = _prompts(6, length=20, seed=1)
    params = [SamplingParams(temperature=1.0, seed=i, max_tokens=40, ignore_eos=True) for i in range(6)]
    sync = make_llm(MODEL, async_scheduling=False, num_kv_blocks=14, block_size=8)
    ahead = make_llm(MODEL, async_scheduling=True, num_kv_blocks=14, block_size=8)
    a, b = _run(sync, prompts, params), _run(ahead, prompts, params)
    _assert_same(a, b)
    assert ahead.core.decode_ahead.num_ahead_steps > 0
    assert sum(o.outputs[0].times.num_preemptions for o in ahead.generate(
        prompts, params)) > 0, "the pool was meant to force preemption"


def test_context_end_and_max_tokens_stop_exactly(make_llm):
    """Requests that end on length (max_tokens, or the context window) stop at the same token
    count as without decode-ahead, including one that fills the context to its last position."""
    prompts = _prompts(3, length=20, seed=2)
    # the third runs to the context end: max_tokens unset is the room left (64 - 22)
    params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in (1, 2, None)]
    sync = make_llm(MODEL, async_scheduling=False, max_model_len=64)
    ahead = make_llm(MODEL, async_scheduling=True, max_model_len=64)
    a, b = _run(sync, prompts, params), _run(ahead, prompts, params)
    _assert_same(a, b)
    assert [len(r[0][0]) for r in b] == [1, 2, 42]
    assert all(r[0][1] == FinishReason.LENGTH for r in b)


def _start(core, rid, prompt, params):
    core.add_request(rid, prompt, params)


def test_abort_while_a_step_is_queued_frees_everything(make_llm):
    llm = make_llm(MODEL, async_scheduling=True)
    core = llm.core
    prompts = _prompts(3, seed=3)
    for i, p in enumerate(prompts):
        _start(core, f"r{i}", p, SamplingParams(temperature=1.0, seed=i, max_tokens=50, ignore_eos=True))
    for _ in range(5):
        core.step()
    assert core.decode_ahead.pending is not None, "a continuation should be queued by now"
    done = core.abort(["r1"])
    assert done[0].outputs[0].finish_reason == FinishReason.ABORT
    seen = {"r0": 0, "r2": 0}
    while core.has_unfinished():
        outs, _ = core.step()
        for o in outs:
            assert o.request_id != "r1", "an aborted request produced output"
            seen[o.request_id] = len(o.outputs[0].token_ids)
    assert seen == {"r0": 50, "r2": 50}
    core.abort(["r0", "r2"])
    assert core.kv.pool.num_free == core.kv.num_blocks


def test_a_new_request_is_scheduled_at_once(make_llm):
    """A request arriving while a step is queued ahead is admitted by the very next scheduling:
    no continuation is queued while an admission is due."""
    llm = make_llm(MODEL, async_scheduling=True)
    core = llm.core
    _start(core, "old", _prompts(1)[0], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True))
    for _ in range(4):
        core.step()
    _start(core, "new", _prompts(1, seed=9)[0], SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
    first_new = None
    for i in range(3):
        outs, _ = core.step()
        if any(o.request_id == "new" and o.outputs[0].token_ids for o in outs):
            first_new = i
            break
    # step 0 commits the step queued before "new" arrived; step 1 is the scheduler's, with "new"
    assert first_new == 1
    while core.has_unfinished():
        core.step()


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=1.3, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6),
    SamplingParams(temperature=0.0, max_tokens=12, logit_bias={5: 3.0}, ignore_eos=True),
    SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True),
], ids=["penalty", "min_tokens", "logit_bias", "logprobs"])
def test_history_dependent_logits_stay_synchronous(make_llm, params):
    """Processors that read the generated tokens need them on the host, and logprobs are read
    there when a step is collected: no step runs ahead."""
    prompts = _prompts(2, seed=4)
    sync = make_llm(MODEL, async_scheduling=False)
    ahead = make_llm(MODEL, async_scheduling=True)
    _assert_same(_run(sync, prompts, [params] * 2), _run(ahead, prompts, [params] * 2))
    assert ahead.core.decode_ahead.num_ahead_steps == 0


def test_fixed_k_never_runs_ahead(make_llm):
    """Every step of fixed k > 0 drafts, so none can be queued before the last is read."""
    llm = make_llm(MODEL, draft_model=MODEL, num_speculative_tokens=2, speculative_k="fixed")
    llm.generate(_prompts(2), SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    assert llm.core.decode_ahead.num_ahead_steps == 0


def test_adaptive_k_held_at_zero_runs_ahead_exactly(make_llm, tiny_checkpoint):
    """An unrelated draft (another random model): adaptive k stays at 0, and the steps it holds
    there without re-evaluating run ahead. Greedy output, and seeded sampling (pinned to k = 0
    under probabilistic verification), equal plain decoding's."""
    prompts = _prompts(4, seed=5)
    params = [SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True),
              SamplingParams(temperature=1.0, seed=21, max_tokens=40, ignore_eos=True)] * 2
    plain = make_llm(MODEL, async_scheduling=False)
    spec = make_llm(MODEL, draft_model="llama", num_speculative_tokens=3, speculative_k="adaptive",
                    async_scheduling=True)
    a, b = _run(plain, prompts, params), _run(spec, prompts, params)
    _assert_same(a, b)
    ctl = spec.core.spec_control.controller
    assert ctl.chosen_counts[0] > 0
    assert spec.core.decode_ahead.num_ahead_steps >= 10


def _fixed_costs(core) -> None:
    """Adaptive k on costs that do not depend on this machine's timing or load: a 10 ms target
    step at every width, a 1 ms draft pass, nothing learnt from measured steps, and a draft
    catch-up of 1 s a token, which keeps k at 0 (no switch or probe pays for it) until a test
    makes it free."""
    ctl = core.spec_control.controller
    ctl.cost = CostModel(Calibration([1, 16], [1, 2, 3, 4], [[0.010] * 4] * 2, [0.001] * 2,
                                     catchup_token=1.0))
    ctl.cost.observe = lambda *args: None


def test_adaptive_k_leaving_zero_runs_the_planned_step_after_the_read(make_llm):
    """A self-draft: adaptive k holds 0 (steps run ahead) until the draft's catch-up becomes
    free, then leaves it. That decision is made in a plan made before the previous step is
    read: the step is not queued ahead but run once the tokens are read. Greedy output equals
    plain decoding's, and every KV block comes back. The costs are fixed: with the calibrated
    ones whether k ever leaves 0 here depends on the machine's load."""
    prompts = _prompts(3, seed=6)
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    plain = make_llm(MODEL, async_scheduling=False, max_model_len=256)
    spec = make_llm(MODEL, draft_model=MODEL, num_speculative_tokens=3, speculative_k="adaptive",
                    max_model_len=256)
    core = spec.core
    _fixed_costs(core)
    for i, p in enumerate(prompts):
        core.add_request(f"r{i}", p, params)
    done, steps = {}, 0
    while core.has_unfinished():
        if steps == 8:
            core.spec_control.controller.cost.cal.catchup_token = 0.0
        for o in core.step()[0]:
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
        steps += 1
    assert [done[f"r{i}"] for i in range(3)] == [r[0][0] for r in _run(plain, prompts, params)]
    ahead = core.decode_ahead
    assert ahead.num_ahead_steps >= 5 and ahead.num_planned_steps > 0
    assert sum(core.spec_control.controller.chosen_counts[1:]) > 0
