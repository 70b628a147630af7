"""Grammar matching for constrained decoding, with llguidance as the engine (see
docs/structured_outputs.md for why).

``GrammarCompiler`` turns a request's :class:`StructuredOutputs` into grammar text once (cached)
and validates it against the tokenizer; ``GrammarState`` is one sequence's matcher.

A state answers one question: *which tokens may follow these generated tokens?* It keeps the
token list its matcher has consumed and, asked about another list, rolls back to their common
prefix and consumes the rest. That single operation serves every row a speculative step needs:

- draft pass j masks with the state after ``outputs + drafts[:j]``;
- verification row j masks with the state after ``outputs + drafts[:j]`` (the same prefixes, so
  their masks are reused from a small per-position cache);
- after the step the next question starts from ``outputs + accepted + 1 token``: the matcher
  rolls back past the first rejected draft and advances through what was accepted.

Masks are llguidance bitmasks (int32 words, bit ``t % 32`` of word ``t // 32`` set when token
``t`` is allowed), kept on the host and expanded on the logits' device.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Optional

import torch

from specserve.engine.structured.params import StructuredOutputs
from specserve.engine.types import ParamError

_ANY_JSON_OBJECT = '{"type": "object"}'


# JSON is written compactly (", " and ": " separators, no other whitespace between tokens), as
# vLLM does by default: free whitespace lets a model pad its output with newlines until max_tokens
_JSON_DEFAULTS = {"whitespace_flexible": False}


def _grammar_text(llg: Any, so: StructuredOutputs) -> str:
    kind, text = so.key()
    if kind in ("json", "json_object"):
        schema = text if kind == "json" else _ANY_JSON_OBJECT
        return llg.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS)
    if kind == "regex":
        return llg.grammar_from("regex", text)
    if kind == "choice":
        return llg.grammar_from("choice", text)
    return llg.grammar_from("grammar", text)


class GrammarCompiler:
    """Per tokenizer: grammar texts by request constraint (LRU), and new matcher states."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: tuple[int, ...],
                 cache_size: int = 256):
        import llguidance
        import llguidance.hf

        self._llg = llguidance
        # the matcher's vocabulary covers both the tokenizer's ids and the model's logits
        self.num_ids = max(vocab_size, len(tokenizer))
        self.vocab_size = vocab_size
        try:
            self._tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.num_ids,
                                                           eos_token=list(eos_token_ids))
        except ValueError as e:
            raise ParamError("structured_outputs", "this model's tokenizer cannot be used for "
                             f"structured outputs: {e}") from None
        self._cache: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()   # validate() runs on the event loop, states on the engine thread

    def compile(self, so: StructuredOutputs) -> str:
        """The validated grammar text for ``so``; a ParamError says what is wrong with it."""
        key = so.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            grammar = _grammar_text(self._llg, so)
        except (ValueError, TypeError) as e:
            raise ParamError("structured_outputs", f"invalid {key[0]} constraint: {e}") from None
        ok, _, error = _validate(self._llg, grammar, self._tokenizer)
        if not ok:
            raise ParamError("structured_outputs", f"invalid {key[0]} constraint: {error}")
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return grammar

    def new_state(self, so: StructuredOutputs) -> "GrammarState":
        matcher = self._llg.LLMatcher(self._tokenizer, self.compile(so), log_level=0)
        return GrammarState(matcher, self.num_ids, self.vocab_size)


def _validate(llg: Any, grammar: str, tokenizer: Any) -> tuple[bool, bool, str]:
    """(ok, has_warnings, message) of llguidance's grammar check."""
    is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    return not is_error, bool(messages), "; ".join(messages)


class GrammarState:
    """One sequence's matcher: the tokens it has consumed and the masks seen along them."""

    def __init__(self, matcher: Any, num_ids: int, vocab_size: int):
        self._m = matcher
        self.num_ids = num_ids
        self.vocab_size = vocab_size
        self.tokens: list[int] = []                  # consumed by the matcher, in order
        self._masks: dict[int, torch.Tensor] = {}    # n -> bitmask after tokens[:n]  [words] int32

    # ---- moving the matcher -------------------------------------------------------------------
    def _rollback_to(self, n: int) -> None:
        drop = len(self.tokens) - n
        if drop <= 0:
            return
        if not self._m.rollback(drop):   # should not happen; replay from the start instead
            self._m.reset()
            if self._m.try_consume_tokens(self.tokens[:n]) != n:
                raise RuntimeError(f"grammar matcher could not replay its own tokens: {self._m.get_error()}")
        del self.tokens[n:]
        for k in [k for k in self._masks if k > n]:
            del self._masks[k]

    def sync(self, generated: list[int]) -> bool:
        """Move the matcher to the state after ``generated``; False if the grammar does not
        allow them (the matcher then stays after the longest allowed prefix)."""
        have = self.tokens
        m = min(len(have), len(generated))
        if have[:m] == generated[:m]:
            common = m
        else:
            common = next(i for i in range(m) if have[i] != generated[i])
        self._rollback_to(common)
        rest = generated[common:]
        if not rest:
            return True
        n = self._m.try_consume_tokens(rest)
        self.tokens.extend(rest[:n])
        return n == len(rest)

    # ---- masks --------------------------------------------------------------------------------
    def bitmask(self, generated: list[int]) -> Optional[torch.Tensor]:
        """The allowed next tokens after ``generated`` as a bitmask [words] int32, or None when
        ``generated`` leaves the grammar (a row no accepted path can reach: left unmasked)."""
        if not self.sync(generated):
            return None
        n = len(self.tokens)
        mask = self._masks.get(n)
        if mask is None:
            mask = torch.frombuffer(bytearray(self._m.compute_bitmask()), dtype=torch.int32)
            self._masks[n] = mask
        return mask

    def mask_row(self, row: torch.Tensor, generated: list[int]) -> None:
        """In place on one logits row [V]: tokens the grammar forbids after ``generated`` -> -inf."""
        bits = self.bitmask(generated)
        if bits is None:
            return
        allowed = unpack_bitmask(bits.to(row.device, non_blocking=True), row.shape[0])
        if bool(allowed.any()):   # an empty mask (should not happen) would leave no token at all
            row.masked_fill_(~allowed, float("-inf"))

    @property
    def is_finished(self) -> bool:
        return bool(self._m.is_stopped())


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(bits: torch.Tensor, width: int) -> torch.Tensor:
    """[words] int32 bitmask -> [width] bool (token t allowed iff bit t % 32 of word t // 32)."""
    shifts = _SHIFTS.get(bits.device)
    if shifts is None:
        shifts = _SHIFTS[bits.device] = torch.arange(32, dtype=torch.int32, device=bits.device)
    flat = ((bits.unsqueeze(-1) >> shifts) & 1).reshape(-1)
    if flat.shape[0] < width:   # logits wider than the matcher's ids: the extra ids are never allowed
        flat = torch.cat([flat, flat.new_zeros(width - flat.shape[0])])
    return flat[:width].bool()
