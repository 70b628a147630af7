"""Async scheduling's queued step (EngineCore._queue_next): once a step's tokens are committed
the next step is scheduled and queued on the device, and only then is the step's text built.

Each test compares the engine against the same engine with ``async_scheduling=False``, token
for token and text for text, and checks that steps really were queued (``num_queued_steps``)
so that a test cannot pass by the feature switching itself off. make_llm checks after each
test that every KV block came back and no request is left.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from specserve.engine import core as engine_core  # noqa: E402
from specserve.engine.runner import phase_clock  # noqa: E402
from specserve.engine.runner.launched import LaunchedStep  # noqa: E402
from specserve.engine.types import FinishReason, SamplingParams  # noqa: E402
from tests.helpers.adaptive_k import script_k  # noqa: E402
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint  # noqa: E402

K = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A target and a noisy copy of it: drafts are accepted and rejected."""
    root = tmp_path_factory.mktemp("schedule_ahead")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    return str(target), str(make_perturbed_copy(target, root / "draft", noise=0.02, seed=7))


def _prompts(n: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 300, (10 + i % 4,), generator=g).tolist() for i in range(n)]


def _params() -> list[SamplingParams]:
    """Greedy, seeded sampling, stop strings (which finish on text), stop tokens, n > 1,
    logprobs and a penalty (the host's draft passes, after the read)."""
    return [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=7, max_tokens=19, ignore_eos=True),
        SamplingParams(temperature=0.9, seed=5, max_tokens=30, stop=["e", "a"]),
        SamplingParams(temperature=1.0, seed=3, n=2, max_tokens=21, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=9, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=11, max_tokens=40, stop_token_ids=[17, 33, 101]),
        SamplingParams(temperature=0.8, seed=13, max_tokens=18, repetition_penalty=1.3, ignore_eos=True),
    ]


def _outcome(outs) -> list:
    return [[(c.token_ids, c.finish_reason, c.text) for c in o.outputs] for o in outs]


def _spec(make_llm, pair, **kw):
    return make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=K, **kw)


def test_output_and_text_are_unchanged_and_steps_are_queued(pair, make_llm):
    prompts, params = _prompts(7, seed=1), _params()
    sync = _spec(make_llm, pair, async_scheduling=False)
    reference = _outcome(sync.generate(prompts, params))
    assert sync.core.num_queued_steps == 0
    llm = _spec(make_llm, pair)
    assert _outcome(llm.generate(prompts, params)) == reference
    assert llm.core.num_queued_steps > 10
    assert reference[2][0][1] == FinishReason.STOP, "the stop-string request must finish on its text"


def test_the_next_step_is_on_the_device_when_step_returns(pair, make_llm):
    """After every step the next one is queued, and the outputs returned carry the step's whole
    text although it was detokenized after the queueing."""
    llm = _spec(make_llm, pair)
    core = llm.core
    core.add_request("a", _prompts(1, seed=2)[0], SamplingParams(temperature=0.0, max_tokens=12,
                                                                 ignore_eos=True))
    texts, kinds = [], []
    while core.has_unfinished():
        outs, _ = core.step()
        if core.has_unfinished():   # a speculative step, or near max_tokens a plain one (decode-ahead)
            kinds.append(type(core._queued[1]))
        texts += [o.outputs[0].text for o in outs]
    assert kinds.count(LaunchedStep) >= 3 and None not in kinds
    sync = _spec(make_llm, pair, async_scheduling=False)
    [ref] = sync.generate([_prompts(1, seed=2)[0]], SamplingParams(temperature=0.0, max_tokens=12,
                                                                   ignore_eos=True))
    assert texts[-1] == ref.outputs[0].text and texts == sorted(texts, key=len)


def test_aborts_and_preemptions_between_steps_change_no_other_output(pair, make_llm):
    """A request aborted, or preempted (tests do; the scheduler never preempts a queued step),
    after the step it is in was queued is dropped from it: the others' tokens are unchanged,
    the preempted ones resume exactly (same Philox keys), and the host's draft passes (the
    penalised request) propose nothing for a request whose blocks are gone."""
    prompts, params = _prompts(7, seed=3), _params()
    ids = [f"r{i}" for i in range(len(prompts))]
    reference = dict(zip(ids, _outcome(_spec(make_llm, pair, async_scheduling=False).generate(prompts, params))))
    llm = _spec(make_llm, pair)
    core = llm.core
    for rid, p, sp in zip(ids, prompts, params):
        core.add_request(rid, p, sp)
    rng = random.Random(4)
    done, aborted, preempted = {}, set(), 0
    while core.has_unfinished():
        outs, _ = core.step()
        for o in outs:
            if o.finished and o.request_id not in aborted:
                done[o.request_id] = _outcome([o])[0]
        queued = {s.request.request_id for s in core._queued[0].scheduled} if core._queued else set()
        running = [r for r in core.scheduler.running if r.request_id in queued]
        if running and rng.random() < 0.6:
            victim = rng.choice(running)
            core.scheduler._preempt(victim)
            preempted += 1
        if len(aborted) < 2 and len(queued) > 3 and rng.random() < 0.2:
            rid = rng.choice(sorted(queued))
            parent = rid.split("#")[0]
            if parent not in aborted and parent != "r6":
                core.abort([parent])
                aborted.add(parent)
    assert preempted > 5 and aborted and core.num_queued_steps > 10
    for rid in ids:
        if rid not in aborted:
            assert done[rid] == reference[rid], rid


def _one_request(core, rid: str = "a", **kw) -> None:
    params = dict(temperature=0.0, max_tokens=24, ignore_eos=True)
    params.update(kw)
    core.add_request(rid, _prompts(1, seed=5)[0], SamplingParams(**params))


def _clock_of_target_forwards(core, monkeypatch, module, reader: str) -> list[float]:
    """A virtual clock for ``module``'s ``time.<reader>``: only the core's target forwards move
    it, by 1 each (the host's work takes none); tests move it themselves for anything else."""
    clock = [0.0]
    monkeypatch.setattr(module, "time", SimpleNamespace(**{reader: lambda: clock[0]}))
    forward = core.runner._forward

    def timed_forward(which, items, input_ids=None):
        if which == "target":
            clock[0] += 1.0
        return forward(which, items, input_ids)
    core.runner._forward = timed_forward
    return clock


def test_a_steps_target_time_is_timed_at_launch_not_until_it_is_read(pair, make_llm, monkeypatch):
    """A step without the chained draft program (here: a penalty, so the host proposes) is read
    in the call after its launch; its target time must not include what happened in between.
    On a virtual clock (a target forward moves it by 1, the caller's work between two calls by
    100), so the machine's load cannot decide the result."""
    llm = _spec(make_llm, pair)
    core = llm.core
    clock = _clock_of_target_forwards(core, monkeypatch, phase_clock, "perf_counter")
    _one_request(core, repetition_penalty=1.3)
    core.step()
    times = []
    while core.has_unfinished():
        clock[0] += 100.0   # the caller's own work between two calls
        _, stats = core.step()
        times.append(stats.target_seconds)
    assert len(times) > 3 and min(times) >= 1.0 and max(times) < 100.0, times


def test_every_decode_step_is_charged_its_own_forward_where_k_changes(pair, make_llm, monkeypatch):
    """Decode-ahead launches plain step N + 1 inside call N (``DecodeAhead.launch_next``), and on
    the CPU a launch runs the forward itself. On a clock that only target forwards move (one
    second each; the host's work takes none), every decode step the cost model learns from
    must read one second. Charged to the call that launched it, the last plain step before k
    leaves 0 read 0 and the first one back at 0 read 2: an EMA averages the pair, a robust
    estimator (a median was tried) learns a wrong k = 0 cost from it."""
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=K, speculative_k="adaptive")
    core = llm.core
    clock = _clock_of_target_forwards(core, monkeypatch, engine_core, "monotonic")
    ks = [0] * 4 + [2] * 2 + [0] * 4 + [1] + [0] * 3 + [3] + [0] * 20
    script_k(core, lambda n: ks[min(n, len(ks) - 1)])
    ctl = core.spec_control.controller
    fed, observe_step = [], ctl.observe_step

    def recording(batch, k_verify, k_draft, tokens, seconds, *rest):
        fed.append((k_verify, k_draft, seconds))
        observe_step(batch, k_verify, k_draft, tokens, seconds, *rest)
    ctl.observe_step = recording
    _one_request(core)
    while core.has_unfinished():
        core.step()
    pairs = {(kv > 0, kd > 0) for kv, kd, _ in fed}
    assert pairs == {(False, False), (False, True), (True, True), (True, False)}
    assert core.decode_ahead.num_ahead_steps > 5 and core.decode_ahead.num_planned_steps == 3
    assert [s for _, _, s in fed] == [1.0] * len(fed), fed


def test_a_failed_launch_is_raised_by_the_next_call_after_this_steps_outputs(pair, make_llm):
    llm = _spec(make_llm, pair)
    core = llm.core
    _one_request(core)
    outs, _ = core.step()
    ref = _spec(make_llm, pair, async_scheduling=False).core
    _one_request(ref)
    ref_outs, _ = ref.step()
    ref_outs, _ = ref.step()

    def broken(so):
        raise RuntimeError("out of memory (simulated)")
    core.runner.launch = broken
    outs, _ = core.step()   # its tokens and text are out; queueing the next one failed
    assert outs[0].outputs[0].text == ref_outs[0].outputs[0].text and outs[0].outputs[0].text
    with pytest.raises(RuntimeError, match="simulated"):
        core.step()
    core.fail_all("launch failed")
    ref.abort(["a"])


def test_aborting_the_last_request_drops_the_queued_step(pair, make_llm):
    llm = _spec(make_llm, pair)
    core = llm.core
    _one_request(core)
    core.step()
    assert core._queued is not None
    core.abort(["a"])
    assert core._queued is None and not core.has_unfinished()


def test_a_failed_launch_whose_requests_are_all_aborted_fails_nothing_later(pair, make_llm):
    llm = _spec(make_llm, pair)
    core = llm.core
    _one_request(core)
    core.step()
    launch = core.runner.launch

    def broken(so):
        raise RuntimeError("out of memory (simulated)")
    core.runner.launch = broken
    core.step()
    core.runner.launch = launch
    core.abort(["a"])
    _one_request(core, "b", max_tokens=4)
    while core.has_unfinished():
        core.step()   # the failure belonged to the aborted request's step
