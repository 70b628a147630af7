"""Requests and checkpoints the engine must refuse, with messages that say why, leaving no trace."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")

from specserve.engine.errors import CapacityError  # noqa: E402
from specserve.engine.types import FinishReason, ParamError, SamplingParams  # noqa: E402

MODEL = "llama"
SUPPORTED = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def _copy_with_config(src, dst, **changes):
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(changes)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def test_unsupported_architecture_names_it_and_the_supported_ones(make_llm, tiny_checkpoint, tmp_path):
    bad = _copy_with_config(tiny_checkpoint(MODEL), tmp_path / "gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError) as info:
        make_llm(bad)
    msg = str(info.value)
    assert "GPT2LMHeadModel" in msg
    for arch in SUPPORTED:
        assert arch in msg


def test_unsupported_rope_scaling_is_refused(make_llm, tiny_checkpoint, tmp_path):
    bad = _copy_with_config(tiny_checkpoint(MODEL), tmp_path / "rope", rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match="longrope"):
        make_llm(bad)


def test_not_a_checkpoint_directory(make_llm, tmp_path):
    with pytest.raises(Exception, match="not a local directory|config.json"):
        make_llm(tmp_path / "missing")


@pytest.mark.parametrize("prompt,params,param", [
    ([7] * 64, SamplingParams(max_tokens=1), "prompt"),                  # fills the context
    ([7] * 60, SamplingParams(max_tokens=10), "max_tokens"),             # 60 + 10 > 64
    ([7, 320, 8], SamplingParams(max_tokens=2), "prompt"),              # vocab is 320
    ([7, -1], SamplingParams(max_tokens=2), "prompt"),
    ([], SamplingParams(max_tokens=2), "prompt"),
    ([7, 8], SamplingParams(max_tokens=2, logit_bias={999: 1.0}), "logit_bias"),
    ([7, 8], SamplingParams(max_tokens=2, stop_token_ids=[320]), "stop_token_ids"),
], ids=["prompt_fills_context", "prompt_plus_max_tokens", "token_id_too_large", "negative_token_id",
        "empty_prompt", "logit_bias_out_of_vocab", "stop_token_out_of_vocab"])
def test_param_errors_at_add_time(prompt, params, param, make_llm):
    llm = make_llm(MODEL, max_model_len=64)
    with pytest.raises(ParamError) as info:
        llm.core.add_request("bad", prompt, params)
    assert info.value.param == param and info.value.message
    assert not llm.core.has_unfinished()


def test_max_tokens_none_runs_to_the_context_end(make_llm):
    llm = make_llm(MODEL, max_model_len=64, num_kv_blocks=4)
    comp = llm.generate([[7] * 60], SamplingParams(max_tokens=None, ignore_eos=True))[0].outputs[0]
    assert len(comp.token_ids) == 4 and comp.finish_reason == FinishReason.LENGTH


def test_request_that_can_never_fit_the_pool(make_llm):
    llm = make_llm(MODEL, num_kv_blocks=4)                    # 64 slots in all
    with pytest.raises(CapacityError) as info:
        llm.core.add_request("big", [7] * 40, SamplingParams(n=3, max_tokens=30))
    assert info.value.param == "prompt" and "KV" in str(info.value)
    assert not llm.core.has_unfinished()
    # exactly the whole pool is fine, and runs
    comp = llm.generate([[7] * 40], SamplingParams(max_tokens=24, ignore_eos=True))[0].outputs[0]
    assert len(comp.token_ids) == 24


def test_duplicate_request_id(make_llm, drive):
    llm = make_llm(MODEL)
    d = drive(llm.core)
    d.add("same", [5, 6, 7], SamplingParams(max_tokens=2))
    with pytest.raises(ParamError) as info:
        llm.core.add_request("same", [5, 6], SamplingParams(max_tokens=2))
    assert info.value.param == "request_id"
    d.until_done()
    d.add("same", [5, 6, 7], SamplingParams(max_tokens=2))       # free again once finished
    d.until_done()


def test_generate_is_all_or_nothing(make_llm):
    llm = make_llm(MODEL, max_model_len=64)
    with pytest.raises(ParamError):
        llm.generate([[5, 6, 7], [5] * 70], SamplingParams(max_tokens=4))
    leftover = sorted(llm.core.scheduler.requests)
    if leftover:  # clean up so the fixture's leak check does not mask the real failure
        llm.core.abort([r.split("#")[0] for r in leftover])
    assert not leftover, f"refused generate() left {leftover} queued"


def test_string_logit_bias_keys_are_coerced_or_refused(make_llm):
    llm = make_llm(MODEL)
    try:
        out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, ignore_eos=True,
                                                       logit_bias={"42": 100.0}))  # type: ignore[dict-item]
    except ParamError:
        return
    except Exception:
        llm.core.abort(list(llm.core._parents))
        raise
    assert out[0].outputs[0].token_ids == [42, 42, 42]
