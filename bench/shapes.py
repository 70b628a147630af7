"""Model shapes the benchmark runs at, written as checkpoint directories without weights.

``write_checkpoint(dir, shape)`` writes config.json, generation_config.json and a tokenizer; the
engine then builds the model with ``load_format="dummy"`` (random weights from config.json
alone). Nothing is downloaded.

The tokenizer covers the model's *whole* vocabulary (`` w0 .. w{V-1}`` plus Qwen's special
tokens at their usual ids), so every generated id decodes to text, and it decodes the way real
Qwen3 and Llama 3 tokenizers do: byte-level (each id's text is its bytes, decoded together), so
the engine's incremental detokenizer takes the same path per token as with English text from a
real checkpoint (each id a whole-character piece, looked up once). Until 2026-12-07 it was
word-level (no byte-level decoder), which sent every token down the detokenizer's general path
(two tokenizer decodes a token) and charged large batches host time a real tokenizer does not
(:func:`word_level_tokenizer` keeps it, for bench/grammar_engines.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

QWEN_ENDOFTEXT = "<|endoftext|>"
QWEN_IM_END = "<|im_end|>"
# architecture -> (config.json "architectures", "model_type")
ARCHITECTURES = {"qwen3": ("Qwen3ForCausalLM", "qwen3"), "llama": ("LlamaForCausalLM", "llama")}


@dataclass(frozen=True)
class ModelShape:
    """The architecture numbers of a Qwen3 (q/k norms) or Llama checkpoint."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int = 40960
    architecture: str = "qwen3"              # qwen3 | llama
    rope_theta: float = 1000000.0

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"architecture {self.architecture!r}: expected one of {sorted(ARCHITECTURES)}")

    @property
    def qk_norm(self) -> bool:
        return self.architecture == "qwen3"

    @property
    def eos_token_id(self) -> int:
        return _special_ids(self.vocab_size)[QWEN_IM_END]

    def num_params(self) -> int:
        """Parameter count (mirrors engine.models.spec.ModelSpec.num_params, plus Qwen3's q/k norms)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return self.num_layers * per_layer + v * h * (1 if self.tie_word_embeddings else 2) + h


# Qwen3-8B: 36 layers, hidden 4096, 32 q heads / 8 kv heads of 128, MLP 12288, untied LM head.
QWEN3_8B_LIKE = ModelShape("qwen3-8b-like", 4096, 36, 32, 8, 128, 12288, 151936, False)
# Qwen3-0.6B: 28 layers, hidden 1024, 16 q heads / 8 kv heads of 128, MLP 3072, tied LM head.
QWEN3_06B_LIKE = ModelShape("qwen3-0.6b-like", 1024, 28, 16, 8, 128, 3072, 151936, True)
# --quick (CPU smoke runs): the same structure (GQA, qk-norm, tied draft), tiny numbers.
TINY_TARGET = ModelShape("tiny-target", 256, 4, 4, 2, 64, 512, 4096, False, 4096)
TINY_DRAFT = ModelShape("tiny-draft", 64, 2, 2, 1, 32, 128, 4096, True, 4096)
# Llama-3-8B: 32 layers, hidden 4096, 32 q heads / 8 kv heads of 128, MLP 14336, 128,256 words,
# untied LM head, RoPE theta 500,000 (no RoPE scaling: Llama 3, not 3.1), no q/k norms.
LLAMA3_8B_LIKE = ModelShape("llama3-8b-like", 4096, 32, 32, 8, 128, 14336, 128256, False, 8192,
                            "llama", 500000.0)
# --quick: the Llama structure (no q/k norms, theta 500,000) at toy size.
TINY_LLAMA = ModelShape("tiny-llama", 256, 2, 4, 2, 64, 512, 4096, False, 4096, "llama", 500000.0)


def _special_ids(vocab_size: int) -> dict[str, int]:
    """Qwen's ids (151643 / 151645) when the vocabulary is Qwen-sized, else the last two ids."""
    if vocab_size > 151645:
        return {QWEN_ENDOFTEXT: 151643, QWEN_IM_END: 151645}
    return {QWEN_ENDOFTEXT: vocab_size - 2, QWEN_IM_END: vocab_size - 1}


def config_dict(shape: ModelShape) -> dict:
    """A Qwen3ForCausalLM or LlamaForCausalLM config.json for ``shape`` (bf16, default RoPE)."""
    special = _special_ids(shape.vocab_size)
    arch, model_type = ARCHITECTURES[shape.architecture]
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_act": "silu",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "max_position_embeddings": shape.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_theta,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": special[QWEN_ENDOFTEXT],
        "eos_token_id": special[QWEN_IM_END],
        "pad_token_id": special[QWEN_ENDOFTEXT],
    }


def _words(vocab_size: int, prefix: str) -> dict[str, int]:
    """The vocabulary of the bench tokenizers: id i is the word ``prefix + str(i)``, except
    Qwen's special tokens at their ids."""
    by_id = {i: s for s, i in _special_ids(vocab_size).items()}
    return {by_id.get(i, f"{prefix}{i}"): i for i in range(vocab_size)}


def build_tokenizer(vocab_size: int):
    """A byte-level PreTrainedTokenizerFast with exactly ``vocab_size`` ids: id i is the word
    `` w<i>`` (written ``Ġw<i>`` in the byte-level alphabet, as GPT-2-style vocabularies write a
    leading space), Qwen's special tokens at their ids. Text made of its words encodes back to
    their ids (any other piece reads as id 0)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    special = _special_ids(vocab_size)
    tok = Tokenizer(models.WordLevel(_words(vocab_size, "\u0120w"), unk_token="\u0120w0"))
    # words split before each space, then written in the byte-level alphabet: " w12 w3" ->
    # "Ġw12", "Ġw3", the vocabulary's own spelling (so text made of its words encodes back)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(" ", behavior="merged_with_next"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in special])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="\u0120w0",
                                   bos_token=QWEN_ENDOFTEXT, eos_token=QWEN_IM_END,
                                   pad_token=QWEN_ENDOFTEXT)


def word_level_tokenizer(vocab_size: int):
    """The word-level tokenizer the dummy checkpoints had until 2026-12-07 (``w<id>`` words, no
    byte-level decoder); bench/grammar_engines.py compares the grammar engines on it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(_words(vocab_size, "w"), unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token=QWEN_ENDOFTEXT,
                                   eos_token=QWEN_IM_END, pad_token=QWEN_ENDOFTEXT)


def write_checkpoint(path: str | os.PathLike, shape: ModelShape, tokenizer=None) -> Path:
    """Write config.json, generation_config.json, tokenizer files and shape.json (no weights)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = config_dict(shape)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": [cfg["eos_token_id"]],
           "pad_token_id": cfg["pad_token_id"], "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    (path / "shape.json").write_text(json.dumps(asdict(shape), indent=2))
    (tokenizer or build_tokenizer(shape.vocab_size)).save_pretrained(str(path))
    return path


def write_pair(root: str | os.PathLike, target: ModelShape, draft: ModelShape) -> tuple[Path, Path]:
    """Target and draft directories under ``root`` sharing one tokenizer (built once)."""
    if target.vocab_size != draft.vocab_size:
        raise ValueError("the target and draft shapes must share a vocabulary")
    root = Path(root)
    tok = build_tokenizer(target.vocab_size)
    return (write_checkpoint(root / target.name, target, tok),
            write_checkpoint(root / draft.name, draft, tok))
