"""IncrementalDetokenizer with a real byte-level BPE tokenizer (trained locally, no torch).

Text may grow only by whole characters, every intermediate text is a prefix of the final one,
and a stop string (which may span tokens) is never shown partially. Every test runs twice: with
the general path only, and with the byte-level fast path (``TokenPieces``) the engine uses.
"""

from __future__ import annotations

import pytest

from specserve.engine.detokenizer import IncrementalDetokenizer, TokenPieces

MULTILINGUAL = "Grüße aus Köln — naïve café, 東京, emoji 🚀✨. Hello, world!"


@pytest.fixture(scope="module")
def tok():
    from tests.helpers.checkpoints import build_tokenizer

    return build_tokenizer()


_PIECES: list = [None]   # the TokenPieces the tests' detokenizers get (None: general path only)


@pytest.fixture(autouse=True, params=["general", "fast-path"])
def path(request, tok):
    _PIECES[0] = TokenPieces(tok) if request.param == "fast-path" else None
    if _PIECES[0] is not None:
        assert _PIECES[0].context_free, "the test tokenizer is byte-level BPE"
    yield request.param
    _PIECES[0] = None


def _byte_level_alphabet() -> dict[int, str]:
    """Byte -> the printable character byte-level BPE uses for it (the GPT-2 convention)."""
    direct = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
              *range(ord("\u00ae"), ord("\u00ff") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in direct:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _detok(tok, prompt: str = "", stop: list[str] | None = None, include: bool = False,
           skip_special: bool = True) -> IncrementalDetokenizer:
    prompt_ids = tok.encode(prompt) if prompt else []
    return IncrementalDetokenizer(tok, prompt_ids, stop or [], include, skip_special, _PIECES[0])


def _feed(d: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    texts = []
    for t in ids:
        assert d.add(t) is None
        texts.append(d.visible_text(False))
    return texts


@pytest.mark.parametrize("prompt", ["", "Hello, world! ", "東"])
def test_multibyte_text_grows_by_whole_characters(tok, prompt):
    ids = tok.encode(MULTILINGUAL)
    assert len(ids) > len(MULTILINGUAL.split()), "the tokenizer should split words into pieces"
    d = _detok(tok, prompt)
    texts = _feed(d, ids)
    assert d.text == MULTILINGUAL
    for t in texts:
        assert "\ufffd" not in t and MULTILINGUAL.startswith(t)


def test_characters_split_byte_by_byte(tok):
    alphabet = _byte_level_alphabet()
    text = "a東京🚀üb"
    raw = text.encode("utf-8")
    ids = [tok.convert_tokens_to_ids(alphabet[b]) for b in raw]
    assert tok.unk_token_id not in ids and None not in ids
    d = _detok(tok, "x")
    for k, t in enumerate(ids, start=1):
        d.add(t)
        # exactly the complete characters among the first k bytes
        assert d.text == raw[:k].decode("utf-8", errors="ignore")
    assert d.text == text


def test_stop_string_spanning_tokens_is_held_back_then_cut(tok):
    sentence = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(sentence)
    for include, want in ((False, "The quick "), (True, "The quick brown fo")):
        d = _detok(tok, stop=["brown fo"], include=include)
        hit, seen = None, []
        for t in ids:
            hit = d.add(t)
            if hit:
                break
            seen.append(d.visible_text(False))
        assert hit == "brown fo" and d.stopped
        assert d.visible_text(False) == d.text == want
        for t in seen:
            assert want.startswith(t)
            assert "brown fo" not in t
            assert not any(t.endswith("brown fo"[:k]) for k in range(1, 8)), t


def test_visible_text_releases_the_held_tail_at_the_end(tok):
    d = _detok(tok, stop=["brown"])
    _feed(d, tok.encode("The quick bro"))
    assert d.text == "The quick bro" and d.visible_text(False) == "The quick "
    assert d.visible_text(True) == "The quick bro"


def test_earliest_stop_string_wins(tok):
    d = _detok(tok, stop=["lazy", "quick", "k b"])
    hit = None
    for t in tok.encode("The quick brown fox jumps over the lazy dog."):
        hit = hit or d.add(t)
    assert hit == "quick" and d.text == "The "


def test_stop_strings_are_not_checked_before_min_tokens(tok):
    ids = tok.encode("ab ab ab")
    d = _detok(tok, stop=["ab"])
    i = 0
    while "ab" not in d.text:                                 # min_tokens not reached yet
        assert d.add(ids[i], check_stop=False) is None
        i += 1
    hit = None
    while hit is None and i < len(ids):
        hit = d.add(ids[i])
        i += 1
    assert hit == "ab", "a later occurrence must still stop"
    assert d.text == "ab "                                   # the first one was let through


def test_special_tokens_skipped_or_shown(tok):
    end = tok.convert_tokens_to_ids("<|end|>")
    ids = tok.encode("hi") + [end] + tok.encode(" there")
    shown = _detok(tok, skip_special=False)
    hidden = _detok(tok)
    _feed(shown, ids)
    _feed(hidden, ids)
    assert hidden.text == "hi there" and shown.text == "hi<|end|> there"


def test_leading_space_of_the_first_output_token(tok):
    d = _detok(tok, "def")
    _feed(d, tok.encode(" add(a, b)"))
    assert d.text == " add(a, b)"


def test_fast_path_text_equals_the_general_path_token_by_token(tok, path):
    """Random ids (whole-character pieces, lone bytes of multi-byte characters, specials) after
    prompts that end inside a character: the text after every token is the general path's."""
    import random

    alphabet = _byte_level_alphabet()
    lone = [tok.convert_tokens_to_ids(alphabet[b]) for b in "東🚀ü".encode("utf-8")]
    pool = tok.encode(MULTILINGUAL) + lone + [tok.convert_tokens_to_ids("<|end|>")]
    rng = random.Random(5)
    pieces = TokenPieces(tok)
    for trial in range(40):
        prompt = rng.sample(pool, 4) + ([lone[0]] if trial % 2 else [])   # odd: ends mid-character
        ids = [rng.choice(pool) for _ in range(30)]
        for skip in (True, False):
            general = IncrementalDetokenizer(tok, prompt, [], False, skip)
            fast = IncrementalDetokenizer(tok, prompt, [], False, skip, pieces)
            for t in ids:
                general.add(t)
                fast.add(t)
                assert fast.text == general.text, (prompt, ids)
    assert sum(p is not None for p in pieces._tables[True].values()) > 10   # the fast path ran


def test_byte_path_text_equals_the_general_path_on_random_bytes(tok, path):
    """Single-byte tokens drawn from every byte value (invalid UTF-8, characters split across
    tokens, the bytes of U+FFFD itself) mixed with whole-character pieces and a special token:
    after every token the text is the general path's, and the byte path decided most of the
    tokens that were not whole characters."""
    import random

    alphabet = _byte_level_alphabet()
    single = [tok.convert_tokens_to_ids(alphabet[b]) for b in range(256)]
    replacement = [tok.convert_tokens_to_ids(alphabet[b]) for b in "\ufffd".encode("utf-8")]
    pool = single + tok.encode(MULTILINGUAL) + [tok.convert_tokens_to_ids("<|end|>")]
    rng = random.Random(11)
    pieces = TokenPieces(tok)
    for trial in range(400):
        # every third trial leans on one multi-byte run so characters complete often
        if trial % 3 == 0:
            ids = [single[b] for b in rng.choice(["東京", "🚀", "ü", "\ufffd"]).encode("utf-8")] * 3
        else:
            ids = [rng.choice(pool) for _ in range(40)]
        if trial % 5 == 1:
            ids[5:5] = replacement
        for skip in (True, False):
            general = IncrementalDetokenizer(tok, [], [], False, skip)
            fast = IncrementalDetokenizer(tok, [], [], False, skip, pieces)
            for t in ids:
                general.add(t)
                fast.add(t)
                assert fast.text == general.text, (trial, ids)
    assert sum(r is not None for r in pieces._raw.values()) > 100   # the byte path ran
