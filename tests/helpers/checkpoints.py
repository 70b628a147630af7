"""Tiny HF-format checkpoints built by the tests themselves (nothing is ever downloaded).

``make_tiny_checkpoint(dir, arch="llama")`` writes config.json, model.safetensors, tokenizer files
(a byte-level BPE trained in milliseconds on built-in text, with a chat template) and
generation_config.json, exactly the layout real checkpoints use.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding is exact.",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
    "Hello, world! Bonjour le monde. Grüße aus Köln — naïve café, 東京, emoji 🚀✨.",
] * 20

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"]


def build_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) trained on a fixed built-in corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                   bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(arch: str, vocab_size: int, eos_id: int, **overrides):
    import transformers as tf

    common = dict(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0,
                  tie_word_embeddings=False, bos_token_id=eos_id, eos_token_id=eos_id,
                  pad_token_id=eos_id)
    common.update(overrides)
    if arch == "llama":
        return tf.LlamaConfig(**common), tf.LlamaForCausalLM
    if arch == "qwen2":
        return tf.Qwen2Config(**common), tf.Qwen2ForCausalLM
    if arch == "qwen3":
        common.setdefault("head_dim", 16)
        return tf.Qwen3Config(**common), tf.Qwen3ForCausalLM
    raise ValueError(f"unknown tiny arch {arch!r}")


def make_tiny_checkpoint(path: str | os.PathLike, arch: str = "llama", seed: int = 0,
                         vocab_size: int = 320, model_vocab_size: int | None = None,
                         **config_overrides) -> Path:
    """Write a random tiny ``arch`` checkpoint (fp32) with its tokenizer to ``path``; return the path.

    ``model_vocab_size`` smaller than the tokenizer's makes a model that only ever emits the first
    ids (handy for statistical tests); larger pads the vocabulary as real checkpoints do.
    """
    import torch
    from transformers import GenerationConfig

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    eos_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config, cls = _config(arch, model_vocab_size or len(tokenizer), eos_id, **config_overrides)
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    GenerationConfig(eos_token_id=eos_id, bos_token_id=eos_id, pad_token_id=eos_id).save_pretrained(path)
    return path


def make_perturbed_copy(src: str | os.PathLike, dst: str | os.PathLike, noise: float,
                        seed: int = 0) -> Path:
    """A draft-like sibling of checkpoint ``src``: every weight plus N(0, noise^2) noise.

    Close enough to the original to be a useful draft, different enough that q != p.
    """
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst, dirs_exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weights = load_file(str(src / "model.safetensors"))
    noisy = {k: (v + noise * torch.randn(v.shape, generator=gen)).contiguous() for k, v in weights.items()}
    save_file(noisy, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def make_layer_prefix_pair(root: str | os.PathLike, num_layers: int = 6, draft_layers: int = 1,
                           seed: int = 0) -> tuple[Path, Path]:
    """A tiny llama target whose layers past ``draft_layers`` add nothing (their attention and MLP
    output projections are zero: they run, and cost, but leave the residual alone) and a draft of
    its first ``draft_layers`` layers with the same weights. The draft predicts the target exactly
    at a fraction of its cost, so speculation pays on any machine: tests that need adaptive k to
    choose drafts use it (a random pair's choice depends on how loaded the machine is)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    root = Path(root)
    target = make_tiny_checkpoint(root / "target", arch="llama", seed=seed, num_hidden_layers=num_layers)
    weights = load_file(str(target / "model.safetensors"))
    for i in range(draft_layers, num_layers):
        for name in (f"model.layers.{i}.self_attn.o_proj.weight", f"model.layers.{i}.mlp.down_proj.weight"):
            weights[name] = torch.zeros_like(weights[name])
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    draft = root / "draft"
    shutil.copytree(target, draft, dirs_exist_ok=True)
    kept = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < draft_layers}
    save_file(kept, str(draft / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((draft / "config.json").read_text())
    config["num_hidden_layers"] = draft_layers
    (draft / "config.json").write_text(json.dumps(config, indent=2))
    return target, draft
