"""Request counters and SamplingParams / SpecDecodeStats value types (no torch)."""

from __future__ import annotations

import pytest

from specserve.engine.request import Request, RequestStatus
from specserve.engine.types import ParamError, SamplingParams, SpecDecodeStats


def _req(prompt_len: int = 5, max_tokens: int = 10) -> Request:
    return Request("r", list(range(prompt_len)), SamplingParams(max_tokens=max_tokens), 3, (0,),
                   max_tokens, 1.5)


def test_views_follow_the_token_list():
    r = _req()
    assert r.parent_id == "r" and r.index == 0 and r.status == RequestStatus.WAITING
    assert r.prompt_token_ids == [0, 1, 2, 3, 4] and r.output_token_ids == []
    r.token_ids += [9, 8]
    r.draft_token_ids = [7, 7, 7]
    r.num_computed_tokens = 6
    assert r.output_token_ids == [9, 8] and r.num_output_tokens == 2 and r.num_tokens == 7
    assert r.num_tokens_with_drafts == 10 and r.num_uncomputed == 4
    assert r.times.arrival == 1.5 and "'r'" in repr(r)
    r.draft_probs = object()
    r.clear_drafts()
    assert r.draft_token_ids == [] and r.draft_probs is None


def test_spec_budget_shrinks_near_max_tokens_and_the_context_end():
    r = _req(prompt_len=5, max_tokens=10)
    assert r.spec_budget(4, 100) == 4
    r.token_ids += [1] * 7                                  # 3 outputs left: last one is sampled
    assert r.spec_budget(4, 100) == 2
    assert r.spec_budget(4, 14) == 1                        # 12 tokens, context of 14
    r.token_ids += [1] * 3
    assert r.spec_budget(4, 100) == 0


@pytest.mark.parametrize("kwargs,param", [
    (dict(n=0), "n"), (dict(n=129), "n"), (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"), (dict(top_p=0.0), "top_p"), (dict(top_p=1.5), "top_p"),
    (dict(top_k=-2), "top_k"), (dict(min_p=1.5), "min_p"), (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-3.0), "frequency_penalty"), (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(max_tokens=0), "max_tokens"), (dict(min_tokens=-1), "min_tokens"),
    (dict(max_tokens=3, min_tokens=4), "min_tokens"), (dict(logprobs=21), "logprobs"),
    (dict(stop=[""]), "stop"), (dict(stop=["x"] * 65), "stop"), (dict(seed=2**63), "seed"),
    (dict(logit_bias={5: 101.0}), "logit_bias"), (dict(logit_bias={5: float("inf")}), "logit_bias"),
])
def test_sampling_params_refuse_bad_values(kwargs, param):
    with pytest.raises(ParamError) as info:
        SamplingParams(**kwargs)
    assert info.value.param == param and param in str(info.value)


def test_sampling_params_normalise():
    p = SamplingParams(stop="###", top_k=-1, temperature=0.0, max_tokens=None)
    assert p.stop == ["###"] and p.top_k == 0 and p.greedy and not p.needs_penalties
    assert SamplingParams(repetition_penalty=1.1).needs_penalties
    assert SamplingParams(presence_penalty=0.1).needs_penalties
    assert SamplingParams(seed=-(2**63)).seed == -(2**63)


def test_spec_decode_stats():
    s = SpecDecodeStats()
    assert s.acceptance_length is None
    s.record(4, 2)
    s.record(4, 4)
    s.record(0, 0)                                          # no drafts: not a verification
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 8, 6)
    assert s.accepted_per_pos == [2, 2, 1, 1] and s.acceptance_length == 4.0
    t = SpecDecodeStats()
    t.record(2, 1)
    t.merge(s)
    assert t.accepted_per_pos == [3, 2, 1, 1] and t.num_drafts == 3
    assert t.as_dict()["acceptance_length"] == pytest.approx(1 + 7 / 3)


def test_request_times_copy_carries_every_field() -> None:
    """RequestTimes.copy (a direct constructor, cheaper than dataclasses.replace) must not drop a
    field added later."""
    import dataclasses

    from specserve.engine.types import RequestTimes

    t = RequestTimes(*[float(i + 1) for i in range(len(dataclasses.fields(RequestTimes)))])
    c = t.copy()
    assert c == t and c is not t
    assert all(getattr(c, f.name) == getattr(t, f.name) for f in dataclasses.fields(RequestTimes))
