"""The dummy checkpoints' tokenizer (bench/shapes.py): every id of the vocabulary decodes to text,
byte-level like a real Qwen3 / Llama 3 tokenizer, so the engine's detokenizer takes its fast path
per token as with English text from a real checkpoint (the word-level tokenizer it replaced sent
every token down the general path)."""

from __future__ import annotations

import pytest

from specserve.bench import shapes
from specserve.engine.detokenizer import IncrementalDetokenizer, TokenPieces


@pytest.fixture(scope="module")
def tok():
    return shapes.build_tokenizer(shapes.TINY_TARGET.vocab_size)


def test_every_id_is_a_word_and_the_special_ids_sit_where_qwen_puts_them(tok):
    v = shapes.TINY_TARGET.vocab_size
    assert len(tok) == v
    assert tok.eos_token_id == v - 1 and tok.pad_token_id == v - 2
    ids = [5, 0, 1234, v - 3]
    assert tok.decode(ids) == "".join(f" w{i}" for i in ids)
    assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    assert tok.decode([7, v - 1], skip_special_tokens=True) == " w7"


def test_the_engine_detokenizer_takes_its_fast_path_for_every_word(tok):
    pieces = TokenPieces(tok)
    assert pieces.context_free
    d = IncrementalDetokenizer(tok, [1, 2, 3], [], False, True, pieces)
    for i in range(10, 60):
        d.add(i)
    assert d.text == "".join(f" w{i}" for i in range(10, 60))
    assert all(pieces._tables[True][i] == f" w{i}" for i in range(10, 60))   # one lookup each
