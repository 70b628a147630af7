"""Tokenizer and token stream for the demo pair.

One byte-level BPE tokenizer (trained with ``tokenizers`` on a seeded sample of the training
files) is shared by target and draft. The training stream is the files' tokens, each file
followed by ``<|endoftext|>``. A seeded fraction of the files is wrapped in the chat template
(a short user turn naming the module, the file as the assistant turn) so that the chat endpoint
answers with code and stops at ``<|end|>``.
"""

from __future__ import annotations

import random
from pathlib import PurePath
from typing import Sequence

import numpy as np

EOS = "<|endoftext|>"
END = "<|end|>"
SPECIAL_TOKENS = [EOS, END, "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MODEL_MAX_LENGTH = 2048


def train_tokenizer(texts: Sequence[str], vocab_size: int):
    """Train the shared byte-level BPE; return a ``tokenizers.Tokenizer``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def to_hf_tokenizer(tok):
    """Wrap a trained ``tokenizers.Tokenizer`` as a transformers fast tokenizer with a chat template."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, bos_token=EOS,
                                   pad_token=EOS, model_max_length=MODEL_MAX_LENGTH,
                                   additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def chat_wrap(path: PurePath, text: str, rng: random.Random) -> str:
    """Render one file as a chat exchange (the same text the chat template produces)."""
    stem = path.stem if path.stem != "__init__" else path.parent.name + " package"
    asks = [f"Write the Python module {stem}.", f"Show me {path.name}.",
            f"Write Python code for {stem.replace('_', ' ')}."]
    user = asks[rng.randrange(len(asks))]
    return f"<|user|>\n{user}{END}\n<|assistant|>\n{text}{END}\n"


def documents(files, chat_fraction: float, seed: int) -> list[str]:
    """The training documents: each file's text, a seeded fraction of them chat-wrapped."""
    rng = random.Random(seed)
    out = []
    for f in files:
        if rng.random() < chat_fraction:
            out.append(chat_wrap(PurePath(f.path), f.text, rng))
        else:
            out.append(f.text)
    return out


def encode_stream(tok, docs: Sequence[str], chunk: int = 4096) -> np.ndarray:
    """Token ids of ``docs`` concatenated, each followed by EOS; uint16 ``[num_tokens]``."""
    eos_id = tok.token_to_id(EOS)
    parts: list[np.ndarray] = []
    for start in range(0, len(docs), chunk):
        for enc in tok.encode_batch(list(docs[start:start + chunk]), add_special_tokens=False):
            ids = enc.ids
            ids.append(eos_id)
            parts.append(np.asarray(ids, dtype=np.uint16))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
