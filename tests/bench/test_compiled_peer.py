"""The compiled peer (bench/compiled_peer.py) decodes exactly what our engine decodes.

fp32 on CPU, greedy: over the same weights, the peer's tokens must equal our engine's token for
token — the bench's shapes with dummy weights (Qwen3 with q/k norms, untied and tied; Llama with
theta 500,000) and tiny trained-format checkpoints whose config.json transformers wrote. One case
runs the peer compiled (Inductor's default mode: CPU has no CUDA graphs), the rest eagerly.
"""

from __future__ import annotations

import json

import pytest
import torch

from specserve.bench import shapes
from specserve.bench.compiled_peer import PeerConfig, peer_cache_len, peer_for_model
from specserve.bench.engines import ModelCache, random_prompts, run_generation
from tests.helpers.checkpoints import make_tiny_checkpoint

PROMPT_LEN = 12
NEW_TOKENS = 20
# dummy weights are N(0, 0.02): too small to move a tied 64-wide model off repeating one token;
# scaled in place (both sides read the same tensors) every sequence varies, so positions matter
DUMMY_SCALE = 5.0


def _ours_and_peer(checkpoint, load_format: str, compile: bool) -> tuple[list[int], list[int], str]:
    cache = ModelCache("cpu", "float32", "torch", 128, False, seed=5)
    try:
        core = cache.core(str(checkpoint), None, 0, 32, load_format, max_num_seqs=2)
        if load_format == "dummy":
            with torch.no_grad():
                for param in core.runner.target.parameters():
                    if param.dim() > 1:
                        param.mul_(DUMMY_SCALE)
        vocab = core.info.vocab_size
        prompt = random_prompts(1, PROMPT_LEN, vocab, seed=11)[0]
        ours = run_generation(core, [prompt], NEW_TOKENS, "ours").outputs["0"]
        peer = peer_for_model(core.runner.target, checkpoint, peer_cache_len(PROMPT_LEN, NEW_TOKENS),
                              compile=compile)
        try:
            theirs = peer.generate(prompt, NEW_TOKENS)
            mode = peer.mode
        finally:
            peer.close()
    finally:
        cache.release()
    return ours, theirs, mode


@pytest.mark.parametrize("shape", [shapes.TINY_TARGET, shapes.TINY_LLAMA, shapes.TINY_DRAFT],
                         ids=lambda s: s.name)
def test_peer_greedy_equals_ours_on_bench_shapes(tmp_path, shape):
    ckpt = shapes.write_checkpoint(tmp_path / shape.name, shape)
    ours, theirs, _ = _ours_and_peer(ckpt, "dummy", compile=False)
    assert len(ours) == NEW_TOKENS
    assert len(set(ours)) > 1, "a degenerate sequence would not test positions"
    assert theirs == ours


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_peer_greedy_equals_ours_on_saved_checkpoints(tmp_path, arch):
    ckpt = make_tiny_checkpoint(tmp_path / arch, arch=arch, seed=7, rope_theta=500000.0)
    ours, theirs, _ = _ours_and_peer(ckpt, "auto", compile=False)
    assert len(set(ours)) > 1
    assert theirs == ours


def test_compiled_peer_equals_ours(tmp_path):
    ckpt = shapes.write_checkpoint(tmp_path / "llama", shapes.TINY_LLAMA)
    ours, theirs, mode = _ours_and_peer(ckpt, "dummy", compile=True)
    assert mode in ("default", "eager")        # eager only where torch.compile failed (noted)
    assert theirs == ours


def test_peer_config_reads_the_checkpoint_and_refuses_what_it_lacks(tmp_path):
    ckpt = shapes.write_checkpoint(tmp_path / "l", shapes.TINY_LLAMA)
    cfg = PeerConfig.from_checkpoint(ckpt)
    assert (cfg.rope_theta, cfg.qk_norm, cfg.tie_word_embeddings) == (500000.0, False, False)
    assert PeerConfig.from_checkpoint(shapes.write_checkpoint(tmp_path / "q", shapes.TINY_DRAFT)).qk_norm
    raw = json.loads((ckpt / "config.json").read_text())
    raw["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    (ckpt / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="llama3"):
        PeerConfig.from_checkpoint(ckpt)


def test_peer_measure_counts_steps(tmp_path):
    ckpt = shapes.write_checkpoint(tmp_path / "l", shapes.TINY_LLAMA)
    cache = ModelCache("cpu", "float32", "torch", 128, False)
    try:
        core = cache.core(str(ckpt), None, 0, 32, "dummy", max_num_seqs=2)
        peer = peer_for_model(core.runner.target, ckpt, peer_cache_len(8, 10), compile=False)
        prompt = random_prompts(1, 8, 4096, 0)[0]
        m = peer.measure(prompt, 3, 6)
        with pytest.raises(ValueError, match="exceed"):
            peer.generate(prompt, peer.model.max_seq_len)
        peer.close()
    finally:
        cache.release()
    assert m.steps == 6 and m.tok_per_s > 0 and m.median_step_s > 0
    assert m.tok_per_s == pytest.approx(6 / m.seconds)
    assert (m.compile_mode, m.compile_note) == ("eager", "compiling switched off")
