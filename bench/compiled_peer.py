"""The compiled peer: batch-1 greedy decode in plain PyTorch, compiled the way gpt-fast does it.

A minimal Llama-family decoder written for this benchmark (RMSNorm, rotary embedding, GQA
attention through ``scaled_dot_product_attention`` over a static KV cache written at
``input_pos``, SwiGLU MLP, tied or untied LM head; Qwen3's per-head q/k norms when the checkpoint
has them). One decode step, ``decode_one_token``, is compiled with
``torch.compile(mode="reduce-overhead", fullgraph=True)`` on CUDA (Inductor kernels replayed as a
CUDA graph); on CPU, which has no CUDA graphs, with the default mode, or eagerly if compiling fails.

The weights are *our engine's* tensors, shared, not copied (:func:`weights_from_model`): the peer
reads exactly the bytes our decode step reads, so both sit under the same roofline. The checkpoint
layout is Hugging Face's (rotate-half RoPE over pairs (i, i + D/2)); q, k, v and gate, up arrive
fused as our loader stores them, which is also how gpt-fast fuses its projections.

Prefill runs eagerly and is not timed. Each timed step ends with the host reading the token, as
our engine's step does, so wall time per step is the step's honest cost.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from specserve.bench.roofline import DecodeMeasurement
from specserve.bench.timing import median, synchronize


@dataclass(frozen=True)
class PeerConfig:
    """The architecture numbers the peer needs, read from config.json on its own."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    qk_norm: bool
    tie_word_embeddings: bool

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("query heads must be a multiple of KV heads")

    @classmethod
    def from_checkpoint(cls, path: str | Path) -> "PeerConfig":
        raw = json.loads((Path(path) / "config.json").read_text())
        rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        kind = rope.get("rope_type") or rope.get("type") or "default"
        if kind != "default":
            raise ValueError(f"the compiled peer implements plain RoPE only, {path} uses {kind!r}")
        if raw.get("attention_bias") or raw.get("mlp_bias") or raw.get("model_type") == "qwen2":
            raise ValueError("the compiled peer has no projection biases")
        heads = raw["num_attention_heads"]
        return cls(vocab_size=raw["vocab_size"], hidden_size=raw["hidden_size"],
                   intermediate_size=raw["intermediate_size"], num_layers=raw["num_hidden_layers"],
                   num_heads=heads, num_kv_heads=raw.get("num_key_value_heads") or heads,
                   head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
                   rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
                   rope_theta=float(rope.get("rope_theta", raw.get("rope_theta", 10000.0))),
                   qk_norm=raw.get("model_type") == "qwen3",
                   tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)))


@dataclass
class LayerWeights:
    wqkv: torch.Tensor                 # [(Hq + 2 Hk) D, H]: q heads, then k heads, then v heads
    wo: torch.Tensor                   # [H, Hq D]
    w_gate_up: torch.Tensor            # [2 I, H]: gate rows, then up rows
    w_down: torch.Tensor               # [H, I]
    attn_norm: torch.Tensor            # [H]
    mlp_norm: torch.Tensor             # [H]
    q_norm: Optional[torch.Tensor]     # [D] (Qwen3) or None
    k_norm: Optional[torch.Tensor]     # [D] (Qwen3) or None


@dataclass
class PeerWeights:
    embed: torch.Tensor                # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor                 # [H]
    lm_head: torch.Tensor              # [V, H] (the embedding itself when tied)


def weights_from_model(model: nn.Module) -> PeerWeights:
    """Our engine's LlamaFamilyModel tensors, shared (no copy), in the peer's layout."""
    layers = []
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        if any(m.bias is not None for m in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)):
            raise ValueError("the compiled peer has no projection biases")
        layers.append(LayerWeights(attn.qkv_proj.weight, attn.o_proj.weight, mlp.gate_up_proj.weight,
                                   mlp.down_proj.weight, layer.input_layernorm,
                                   layer.post_attention_layernorm, attn.q_norm, attn.k_norm))
    return PeerWeights(model.embed_tokens.weight, layers, model.norm, model.lm_head_weight)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise the last dim in fp32, scale in the input dtype."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return normed.type_as(x) * weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, HF layout: dims i and i + D/2 form a pair. x: [1, T, heads, D];
    cos, sin: [T, D/2] fp32."""
    half = x.shape[-1] // 2
    x32 = x.float()
    a, b = x32[..., :half], x32[..., half:]                     # [1, T, heads, D/2]
    c, s = cos[None, :, None, :], sin[None, :, None, :]          # [1, T, 1, D/2]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1).type_as(x)


def _frozen(t: torch.Tensor) -> nn.Parameter:
    """A Parameter over the same storage (the engine's weights are not copied)."""
    return nn.Parameter(t.detach(), requires_grad=False)


class PeerLayer(nn.Module):
    def __init__(self, cfg: PeerConfig, w: LayerWeights, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.wqkv, self.wo = _frozen(w.wqkv), _frozen(w.wo)
        self.w_gate_up, self.w_down = _frozen(w.w_gate_up), _frozen(w.w_down)
        self.attn_norm, self.mlp_norm = _frozen(w.attn_norm), _frozen(w.mlp_norm)
        self.q_norm = _frozen(w.q_norm) if cfg.qk_norm else None
        self.k_norm = _frozen(w.k_norm) if cfg.qk_norm else None
        cache_shape = (1, cfg.num_kv_heads, max_seq_len, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(cache_shape, dtype=w.wqkv.dtype, device=w.wqkv.device),
                             persistent=False)                  # [1, Hk, S, D]
        self.register_buffer("v_cache", torch.zeros_like(self.k_cache), persistent=False)

    def attention(self, h: torch.Tensor, input_pos: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        t = h.shape[1]
        hq, hk, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = F.linear(h, self.wqkv).split([hq * d, hk * d, hk * d], dim=-1)
        q, k, v = q.view(1, t, hq, d), k.view(1, t, hk, d), v.view(1, t, hk, d)
        if self.q_norm is not None:
            q, k = _rms_norm(q, self.q_norm, cfg.rms_norm_eps), _rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        self.k_cache[:, :, input_pos] = k.transpose(1, 2)       # [1, Hk, T, D] into [1, Hk, S, D]
        self.v_cache[:, :, input_pos] = v.transpose(1, 2)
        # GQA without repeating the cache: the g query heads of one KV head become g * T rows
        g = hq // hk
        rows = q.transpose(1, 2).reshape(1, hk, g * t, d)       # [1, Hk, g T, D]
        row_mask = mask.repeat(g, 1)                            # [g T, S]
        out = F.scaled_dot_product_attention(rows, self.k_cache, self.v_cache, attn_mask=row_mask)
        out = out.reshape(1, hq, t, d).transpose(1, 2).reshape(1, t, hq * d)   # [1, T, Hq D]
        return F.linear(out, self.wo)

    def forward(self, x: torch.Tensor, input_pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        eps = self.cfg.rms_norm_eps
        x = x + self.attention(_rms_norm(x, self.attn_norm, eps), input_pos, cos, sin, mask)
        gate, up = F.linear(_rms_norm(x, self.mlp_norm, eps), self.w_gate_up).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, self.w_down)


class PeerDecoder(nn.Module):
    """tokens [1, T] at positions ``input_pos`` [T] -> logits [1, T, V]; fills the static KV cache."""

    def __init__(self, cfg: PeerConfig, w: PeerWeights, max_seq_len: int):
        super().__init__()
        self.cfg, self.max_seq_len = cfg, max_seq_len
        self.embed = _frozen(w.embed)
        self.layers = nn.ModuleList(PeerLayer(cfg, lw, max_seq_len) for lw in w.layers)
        self.norm = _frozen(w.norm)
        self.lm_head = self.embed if cfg.tie_word_embeddings else _frozen(w.lm_head)
        device = w.embed.device
        d = cfg.head_dim
        inv_freq = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
        angles = torch.arange(max_seq_len, dtype=torch.float64, device=device)[:, None] * inv_freq
        self.register_buffer("rope_cos", angles.cos().float(), persistent=False)   # [S, D/2]
        self.register_buffer("rope_sin", angles.sin().float(), persistent=False)   # [S, D/2]
        causal = torch.ones(max_seq_len, max_seq_len, dtype=torch.bool, device=device).tril()
        self.register_buffer("causal", causal, persistent=False)                   # [S, S]

    def forward(self, tokens: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
        cos, sin = self.rope_cos[input_pos], self.rope_sin[input_pos]              # [T, D/2]
        mask = self.causal[input_pos]                                              # [T, S]
        x = F.embedding(tokens, self.embed)                                        # [1, T, H]
        for layer in self.layers:
            x = layer(x, input_pos, cos, sin, mask)
        return F.linear(_rms_norm(x, self.norm, self.cfg.rms_norm_eps), self.lm_head)


def decode_one_token(model: PeerDecoder, token: torch.Tensor, input_pos: torch.Tensor) -> torch.Tensor:
    """token [1, 1] at input_pos [1] -> the greedy next token [1, 1]."""
    logits = model(token, input_pos)                 # [1, 1, V]
    return logits[:, -1].argmax(dim=-1, keepdim=True)


@dataclass
class PeerMeasurement(DecodeMeasurement):
    """Our decode measurement's fields, plus how the peer was compiled."""

    compile_mode: str                  # reduce-overhead | default | eager
    compile_note: str                  # why eager, when it is
    first_call_s: float                # the first decode call: compiling included (capture is the 2nd)
    cudagraph_skips: Optional[int]     # graphs Inductor declined to capture (reduce-overhead ran
                                       # without CUDA graphs there: launch-bound)


def _cudagraph_skips() -> Optional[int]:
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return None
    return int(counters["inductor"]["cudagraph_skips"])


class CompiledPeer:
    """A PeerDecoder plus its compiled step (kept on the object, not rebound as a global)."""

    def __init__(self, cfg: PeerConfig, weights: PeerWeights, max_seq_len: int, compile: bool = True):
        self.device = weights.embed.device
        self.model = PeerDecoder(cfg, weights, max_seq_len).eval()
        self.mode = "eager"
        self.note = "" if compile else "compiling switched off"
        self._step: Callable[..., torch.Tensor] = decode_one_token
        if compile and not hasattr(torch, "compile"):
            self.note = "torch.compile is not available"
        elif compile:
            self.mode = "reduce-overhead" if self.device.type == "cuda" else "default"
            # CUDA graphs (reduce-overhead) exist only on CUDA; on CPU Inductor's default mode
            self._step = torch.compile(decode_one_token, mode=self.mode, fullgraph=True)

    def _call_step(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        if self.mode == "reduce-overhead":
            torch.compiler.cudagraph_mark_step_begin()   # the previous step's outputs are done with
        return self._step(self.model, token, pos)

    def _first_call(self, token: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The call that compiles; on CPU a failure to compile falls back to eager (noted)."""
        try:
            return self._call_step(token, pos)
        except Exception as e:   # noqa: BLE001 - Inductor's errors have no common type
            if self.mode == "eager" or self.device.type == "cuda":
                raise
            self.mode, self.note = "eager", f"torch.compile failed on CPU: {type(e).__name__}: {e}"[:300]
            self._step = decode_one_token
            return self._call_step(token, pos)

    @torch.no_grad()
    def prefill(self, prompt: list[int]) -> int:
        """Fill the cache with ``prompt`` (eager, untimed); returns the first generated token."""
        if len(prompt) + 1 > self.model.max_seq_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room in a "
                             f"{self.model.max_seq_len}-slot cache")
        tokens = torch.tensor([prompt], dtype=torch.long, device=self.device)       # [1, P]
        pos = torch.arange(len(prompt), device=self.device)                         # [P]
        return int(self.model(tokens, pos)[0, -1].argmax())

    @torch.no_grad()
    def _decode(self, prompt: list[int], n: int, on_step: Callable[[int, float], None]) -> list[int]:
        first = self.prefill(prompt)
        if len(prompt) + n > self.model.max_seq_len:
            raise ValueError(f"{len(prompt)} + {n} tokens exceed the peer's "
                             f"{self.model.max_seq_len}-slot cache")
        token = torch.tensor([[first]], dtype=torch.long, device=self.device)       # [1, 1]
        pos = torch.tensor([len(prompt)], dtype=torch.long, device=self.device)     # [1]
        out = [first]
        for i in range(n - 1):
            t0 = time.perf_counter()
            nxt = self._first_call(token, pos) if i == 0 else self._call_step(token, pos)
            out.append(int(nxt.item()))             # the host reads the token: the step's one sync
            on_step(i, time.perf_counter() - t0)
            token = nxt.clone()                     # the graph's output buffer is reused next replay
            pos += 1
        return out

    def generate(self, prompt: list[int], n: int) -> list[int]:
        """Greedy: ``n`` tokens after ``prompt`` (the first from the prefill)."""
        return self._decode(prompt, n, lambda i, s: None)

    def measure(self, prompt: list[int], warmup_steps: int, steps: int) -> PeerMeasurement:
        """``warmup_steps`` decode steps (compile, capture), then ``steps`` timed ones."""
        if warmup_steps < 1 or steps < 1:
            raise ValueError("at least one warm-up step (it compiles) and one timed step")
        times: list[float] = []
        first: list[float] = []

        def record(i: int, seconds: float) -> None:
            if i == 0:
                first.append(seconds)
            if i >= warmup_steps:
                times.append(seconds)

        skips = _cudagraph_skips()      # a process-wide counter: count this run's skips only
        synchronize(self.device)
        self._decode(prompt, warmup_steps + steps + 1, record)
        after = _cudagraph_skips()
        return PeerMeasurement(len(prompt), warmup_steps, steps, sum(times), median(times), min(times),
                               self.mode, self.note, first[0],
                               None if skips is None or after is None else after - skips)

    def close(self) -> None:
        """Drop the model, its cache and every compiled graph (the weights stay with their owner)."""
        self.model = None
        self._step = decode_one_token
        if self.mode != "eager":
            torch._dynamo.reset()


def peer_cache_len(prompt_len: int, new_tokens: int, multiple: int = 16) -> int:
    """Static KV slots for a prompt and ``new_tokens``, rounded up (attention reads all of them)."""
    return multiple * math.ceil((prompt_len + new_tokens + 1) / multiple)


def peer_for_model(model: nn.Module, checkpoint: str | Path, max_seq_len: int,
                   compile: bool = True) -> CompiledPeer:
    """The compiled peer over ``model``'s own weights (config read from ``checkpoint``)."""
    cfg = PeerConfig.from_checkpoint(checkpoint)
    return CompiledPeer(cfg, weights_from_model(model), max_seq_len, compile)
