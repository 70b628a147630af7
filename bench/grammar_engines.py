"""Mask cost per token of the two grammar engines (xgrammar, llguidance) at a full vocabulary.

    python -m specserve.bench.grammar_engines [--vocab 151936] [--out docs/grammar_engines.json]

A byte-level BPE tokenizer of exactly ``--vocab`` ids is trained locally on the Python sources of
the installed packages (nothing is downloaded; cached under ``build/grammar_bench_tokenizer``), so
that the vocabulary looks like a real code/chat model's: many tokens mix punctuation, quotes and
letters, which is what makes JSON masks expensive. The word-level tokenizer of bench/shapes.py
(``word_level_tokenizer``, the dummy checkpoints' tokenizer until 2026-12-07)
is measured too (every token is a ``w<id>`` word: masks are cheap, a lower bound).

For each engine and grammar a valid output is tokenized and replayed: per token, the time to
fill the next-token bitmask, and the time to accept the token; then the cost of the speculative
pattern (advance through k = 4 tokens filling a mask at each, roll back 4). Compile time is
reported separately (first compile, no cache).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import site
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "zip": {"type": "string"}},
                    "required": ["city", "zip"]},
        "role": {"enum": ["admin", "user", "guest"]},
        "score": {"type": "number"},
    },
    "required": ["name", "age", "email", "tags", "address", "role", "score"],
    "additionalProperties": False,
}
INSTANCE = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
            "tags": ["math", "engines", "poetry of science"],
            "address": {"city": "London", "zip": "W1 1AA"}, "role": "admin", "score": 98.5}
REGEX = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z( [A-Za-z ]{1,40})?"
REGEX_TEXT = "2026-11-24T09:30:00Z Structured outputs benchmark"


def trained_tokenizer(vocab_size: int, cache: Path):
    """A byte-level BPE PreTrainedTokenizerFast with exactly ``vocab_size`` ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if (cache / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(str(cache))
    roots = site.getsitepackages()
    files = sorted(f for r in roots for f in glob.glob(f"{r}/**/*.py", recursive=True))

    def texts():
        for f in files:
            try:
                yield Path(f).read_text(errors="ignore")
            except OSError:
                continue

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   bos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.save_pretrained(str(cache))
    return fast


class XGrammarBench:
    name = "xgrammar"

    def __init__(self, tok, vocab_size: int):
        import xgrammar as xgr

        self.xgr = xgr
        info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab_size,
                                                  stop_token_ids=[tok.eos_token_id])
        self.compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.mask = xgr.allocate_token_bitmask(1, vocab_size)

    def compile(self, kind: str, text: str):
        if kind == "json":
            return self.compiler.compile_json_schema(text)
        if kind == "json_object":
            return self.compiler.compile_builtin_json_grammar()
        return self.compiler.compile_regex(text)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled, max_rollback_tokens=16)

    def fill(self, m) -> None:
        m.fill_next_token_bitmask(self.mask, 0)

    def accept(self, m, token: int) -> bool:
        return m.accept_token(token)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


class LLGuidanceBench:
    name = "llguidance"

    def __init__(self, tok, vocab_size: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.fill_fn = llguidance.torch.fill_next_token_bitmask
        self.lltok = llguidance.hf.from_tokenizer(tok, n_vocab=vocab_size)
        self.mask = llguidance.torch.allocate_token_bitmask(1, vocab_size)

    def compile(self, kind: str, text: str):
        if kind == "json":
            return self.llg.LLMatcher.grammar_from_json_schema(text)
        if kind == "json_object":
            return self.llg.grammar_from("json_schema", '{"type": "object"}')
        return self.llg.LLMatcher.grammar_from_regex(text)

    def matcher(self, grammar):
        m = self.llg.LLMatcher(self.lltok, grammar)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m) -> None:
        self.fill_fn(m, self.mask, 0)

    def accept(self, m, token: int) -> bool:
        return m.consume_token(token)

    def rollback(self, m, n: int) -> None:
        m.rollback(n)


def _us(seconds: list[float]) -> dict:
    s = sorted(seconds)
    return {"mean_us": round(1e6 * statistics.fmean(s), 1), "p50_us": round(1e6 * s[len(s) // 2], 1),
            "p99_us": round(1e6 * s[min(len(s) - 1, int(0.99 * len(s)))], 1)}


def measure(engine, kind: str, grammar_text: str, tokens: list[int], repeats: int, k: int = 4) -> dict:
    t0 = time.perf_counter()
    compiled = engine.compile(kind, grammar_text)
    m = engine.matcher(compiled)
    compile_s = time.perf_counter() - t0
    fills, accepts, spec = [], [], []
    for _ in range(repeats):
        m = engine.matcher(compiled)
        for tok in tokens:
            t = time.perf_counter()
            engine.fill(m)
            fills.append(time.perf_counter() - t)
            t = time.perf_counter()
            ok = engine.accept(m, tok)
            accepts.append(time.perf_counter() - t)
            if not ok:
                raise RuntimeError(f"{engine.name} rejected token {tok} of a valid {kind} output")
    m = engine.matcher(compiled)
    for i in range(len(tokens) - k):   # the speculative pattern: k masks forward, roll back k
        t = time.perf_counter()
        for tok in tokens[i:i + k]:
            engine.fill(m)
            engine.accept(m, tok)
        engine.fill(m)
        engine.rollback(m, k)
        spec.append(time.perf_counter() - t)
        engine.accept(m, tokens[i])
    return {"engine": engine.name, "grammar": kind, "tokens": len(tokens),
            "compile_ms": round(1e3 * compile_s, 1), "fill": _us(fills), "accept": _us(accepts),
            f"verify_k{k}": _us(spec)}


def run(vocab_size: int, repeats: int, cache: Path) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from specserve.bench.shapes import word_level_tokenizer as word_level

    t0 = time.perf_counter()
    bpe = trained_tokenizer(vocab_size, cache)
    print(f"BPE tokenizer: {len(bpe)} ids ({time.perf_counter() - t0:.1f}s)", flush=True)
    rows = []
    doc = json.dumps(INSTANCE)
    for tok_name, tok in (("bpe", bpe), ("word-level", word_level(vocab_size))):
        cases = [("json", json.dumps(SCHEMA), doc), ("json_object", "", doc)]
        if tok_name == "bpe":
            cases.append(("regex", REGEX, REGEX_TEXT))
        else:   # words only: the JSON text cannot be spelled by w<id> tokens; a regex over them can
            cases = [("regex", r"(w[0-9]+){1,50}", " ".join(f"w{i}" for i in range(1000, 1040)))]
        for cls in (XGrammarBench, LLGuidanceBench):
            try:
                engine = cls(tok, vocab_size)
            except ValueError as e:   # llguidance needs a byte-level or byte-fallback decoder
                rows.append({"engine": cls.name, "tokenizer": tok_name, "error": str(e)})
                print(json.dumps(rows[-1]), flush=True)
                continue
            for kind, grammar, text in cases:
                ids = tok.encode(text, add_special_tokens=False)
                if kind != "regex" or tok_name == "word-level":
                    ids = ids + [tok.eos_token_id] if kind != "regex" else ids
                row = measure(engine, kind, grammar, ids, repeats)
                row["tokenizer"] = tok_name
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cache", default="build/grammar_bench_tokenizer")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = run(args.vocab, args.repeats, Path(args.cache))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
