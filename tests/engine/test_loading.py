"""Checkpoint loading: sharded safetensors with an index, and dummy weights from config.json alone."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from specserve.engine import SamplingParams
from tests.helpers.checkpoints import make_tiny_checkpoint


def test_sharded_checkpoint_loads_like_the_single_file(make_llm, tmp_path):
    single = make_tiny_checkpoint(tmp_path / "single", "qwen3", seed=4, initializer_range=0.2)
    sharded = tmp_path / "sharded"
    model = AutoModelForCausalLM.from_pretrained(single, dtype=torch.float32)
    model.save_pretrained(sharded, max_shard_size="40KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (sharded / f).write_bytes((single / f).read_bytes())
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1, "the checkpoint should really be sharded"
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = [[5, 6, 7, 8], list(range(20, 45))]
    a = [o.outputs[0].token_ids for o in make_llm(str(single)).generate(prompts, params)]
    b = [o.outputs[0].token_ids for o in make_llm(str(sharded)).generate(prompts, params)]
    assert a == b


def test_dummy_weights_need_only_the_config(make_llm, tmp_path):
    src = make_tiny_checkpoint(tmp_path / "src", "llama")
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (bare / f).write_bytes((src / f).read_bytes())
    llm = make_llm(str(bare), load_format="dummy", dtype="bfloat16")
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
