"""Structured outputs through the engine: greedy output under a JSON schema is identical with and
without speculation (and equal to a step-by-step constrained greedy oracle built from
transformers + the grammar engine), outputs parse and match their schema, constrained and free
requests share batches, preemption rolls the matcher back, bad constraints are refused."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from specserve.engine import ParamError, SamplingParams
from specserve.engine.structured import StructuredOutputs
from specserve.engine.structured.grammar import GrammarCompiler, unpack_bitmask
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

SCHEMA = {
    "type": "object",
    "properties": {
        "ok": {"type": "boolean"},
        "color": {"enum": ["red", "green", "blue"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"type": "string", "maxLength": 6},
    },
    "required": ["ok", "color", "n", "tag"],
    "additionalProperties": False,
}
SO = StructuredOutputs(json=SCHEMA)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("structured")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=7)
    return str(target), str(draft)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 300) for _ in range(rng.randrange(2, 40))] for _ in range(n)]


def _greedy(max_tokens: int = 64, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=SO, **kw)


def _check_outputs(outs) -> int:
    """Every finished output is schema-valid JSON; returns how many finished by themselves."""
    done = 0
    for o in outs:
        for c in o.outputs:
            if str(c.finish_reason) == "stop":
                jsonschema.validate(json.loads(c.text), SCHEMA)
                done += 1
    return done


def test_greedy_under_a_schema_is_identical_with_and_without_speculation(pair, make_llm):
    prompts = _prompts(12)
    plain = make_llm(pair[0]).generate(prompts, _greedy())
    for k in (1, 3):
        llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=k)
        spec = llm.generate(prompts, _greedy())
        assert [c.token_ids for o in spec for c in o.outputs] == [c.token_ids for o in plain for c in o.outputs]
        stats = [c.spec_decode for o in spec for c in o.outputs]
        drafts, accepted = sum(s.num_draft_tokens for s in stats), sum(s.num_accepted_tokens for s in stats)
        assert 0 < accepted < drafts, "both acceptance and rejection must happen"
    assert _check_outputs(plain) >= 6


def test_greedy_under_a_schema_equals_a_step_by_step_constrained_oracle(pair, make_llm, hf_model):
    """Independent of the runner: transformers logits, a fresh matcher, argmax over allowed."""
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    prompts = _prompts(3, seed=4)
    outs = llm.generate(prompts, _greedy(40))
    model = hf_model(pair[0])
    compiler = GrammarCompiler(llm.tokenizer, model.config.vocab_size, llm.core.info.eos_token_ids)
    for prompt, out in zip(prompts, outs):
        state, ids, want = compiler.new_state(SO), list(prompt), []
        for _ in range(len(out.outputs[0].token_ids)):
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0, -1]
            allowed = unpack_bitmask(state.bitmask(want), logits.shape[0])
            tok = int(torch.where(allowed, logits, float("-inf")).argmax())
            want.append(tok)
            ids.append(tok)
            if tok in llm.core.info.eos_token_ids:
                break
        assert out.outputs[0].token_ids == want


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    return lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_sampled_outputs_match_the_schema_and_free_requests_are_unaffected(pair, make_llm):
    prompts = _prompts(8, seed=2)
    free = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3).generate(prompts, free)
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    sampled = SamplingParams(temperature=1.0, seed=3, n=4, max_tokens=64, structured_outputs=SO)
    mixed = llm.generate(prompts + prompts, [free] * 8 + [sampled] * 8)
    assert [o.outputs[0].token_ids for o in mixed[:8]] == [o.outputs[0].token_ids for o in alone]
    assert _check_outputs(mixed[8:]) >= 8


def test_preemption_rolls_the_matcher_back(pair, make_llm):
    prompts = _prompts(12, seed=3)
    plain = make_llm(pair[0]).generate(prompts, _greedy())
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4, num_kv_blocks=14,
                   max_num_batched_tokens=16)
    outs = llm.generate(prompts, _greedy())
    assert [c.token_ids for o in outs for c in o.outputs] == [c.token_ids for o in plain for c in o.outputs]


@pytest.mark.parametrize("so", [dict(regex="r(e|d"), dict(grammar="start: ((("),
                                dict(json={"type": "objectx"})])
def test_invalid_constraints_are_refused(pair, make_llm, so):
    llm = make_llm(pair[0])
    with pytest.raises(ParamError) as e:
        llm.generate([[5, 6, 7]], SamplingParams(structured_outputs=StructuredOutputs(**so)))
    assert e.value.param == "structured_outputs"


def test_choice_regex_and_json_object(pair, make_llm):
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=3)
    outs = llm.generate(_prompts(3, seed=9), [
        SamplingParams(temperature=0.8, seed=1, max_tokens=16,
                       structured_outputs=StructuredOutputs(choice=["yes", "no", "maybe"])),
        SamplingParams(temperature=0.8, seed=1, max_tokens=16,
                       structured_outputs=StructuredOutputs(regex=r"[0-9]{3}-[a-z]{2}")),
        SamplingParams(temperature=0, max_tokens=200, structured_outputs=StructuredOutputs(json_object=True)),
    ])
    assert outs[0].outputs[0].text in ("yes", "no", "maybe")
    assert outs[1].outputs[0].text[:3].isdigit() and outs[1].outputs[0].text[3] == "-"
    if str(outs[2].outputs[0].finish_reason) == "stop":
        assert isinstance(json.loads(outs[2].outputs[0].text), dict)


def test_structured_outputs_params_validation():
    with pytest.raises(ParamError):
        StructuredOutputs()
    with pytest.raises(ParamError):
        StructuredOutputs(regex="a", choice=["b"])
    with pytest.raises(ParamError):
        StructuredOutputs(json="{not json")
    assert StructuredOutputs(json='{"type": "object"}').json == {"type": "object"}
