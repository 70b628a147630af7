"""Prompt preparation off the event loop: tokenization and chat-template rendering.

Both can take seconds on large inputs (a 7.6 MB prompt took 5.8 s to tokenize), and on the event
loop that time stalls every stream and ``/health``. Here they run in a bounded pool of worker
threads (``--preprocess-workers``), after cheap checks that refuse what can never fit:

* **Characters against max_model_len.** No token of the tokenizer stands for more than
  ``max_token_bytes`` bytes of text (the longest vocabulary entry, counted in UTF-8, which
  over-counts the byte-level and SentencePiece spellings and so errs on the safe side), and a
  character is at least one byte, so a text of ``c`` characters has at least
  ``c / max_token_bytes`` tokens. A Unicode normalizer (NFC/NFKC) can merge up to 4 characters
  into one, so the bound is multiplied by 4 when one is present; with normalizers that can delete
  text (strip, replace, precompiled SentencePiece maps) no sound bound exists and the character
  check is off (the truncated tokenization below still bounds the work's memory).
  ``max_prompt_chars = max_model_len * max_token_bytes * shrink``: a longer prompt is refused
  with a 400 before it is tokenized.
* **The rendered chat prompt** is refused when it is longer than the same cap (or, without a
  sound bound, twice the request-body limit).
* **Tokenization stops at max_model_len tokens**: a private copy of the fast tokenizer with
  truncation at ``max_model_len`` (set once, never changed, so worker threads share it safely)
  encodes through ``encode_batch``, which releases the GIL; a prompt that reaches the limit is
  refused as "at least max_model_len tokens" without building a huge id list. The copy is
  checked against the tokenizer itself on sample texts at start-up; if they disagree, the
  tokenizer's own ``__call__`` is used instead.

Model chat templates (the checkpoint's own) render in the worker threads; templates sent by
clients render in a separate process (:mod:`specserve.server.template_sandbox`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, TypeVar

from specserve.server.errors import APIError, bad_request
from specserve.server.template_sandbox import (RenderLimits, TemplateRenderError, continue_final_message,
                                               render_blocking)

logger = logging.getLogger(__name__)

T = TypeVar("T")
DEFAULT_WORKERS = max(2, min(8, os.cpu_count() or 2))
DEFAULT_TEMPLATE_TIMEOUT = 2.0
_UNICODE_NORMALIZERS = {"NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1, "Lowercase": 1, "Prepend": 1}
_PROBES = ["def add(a, b):\n    return a + b", " leading and  double  spaces", "ünïcödé ☃ 日本語 👍",
           "\t\r\n", "a" * 300]


def _normalizer_shrink(tokenizer: Any) -> Optional[int]:
    """How many characters a normalizer may merge into one (1 = none); None = it may delete text."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        spec = json.loads(backend.to_str()).get("normalizer")
    except (ValueError, AttributeError):
        return None
    if spec is None:
        return 1
    parts = spec.get("normalizers", []) if spec.get("type") == "Sequence" else [spec]
    shrink = 1
    for part in parts:
        factor = _UNICODE_NORMALIZERS.get(part.get("type"))
        if factor is None:
            return None
        shrink *= factor
    return shrink


def max_token_bytes(tokenizer: Any) -> int:
    """The longest vocabulary entry (added tokens included) in UTF-8 bytes of its spelling."""
    return max((len(piece.encode("utf-8", "surrogatepass")) for piece in tokenizer.get_vocab()), default=1)


def prompt_char_bound(tokenizer: Any, max_model_len: int) -> Optional[int]:
    """Characters beyond which a text surely has more than ``max_model_len`` tokens (None: no bound)."""
    shrink = _normalizer_shrink(tokenizer)
    if shrink is None:
        return None
    return max_model_len * max(1, max_token_bytes(tokenizer)) * shrink


def _truncating_copy(tokenizer: Any, max_len: int) -> Optional[Any]:
    """A copy of the fast tokenizer that stops at ``max_len`` ids, if it agrees with the original."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        from tokenizers import Tokenizer

        copy = Tokenizer.from_str(backend.to_str())
        copy.no_padding()
        copy.enable_truncation(max_len)
        for text in _PROBES:
            for special in (True, False):
                mine = copy.encode_batch([text], add_special_tokens=special)[0].ids
                theirs = list(tokenizer(text, add_special_tokens=special)["input_ids"])
                if mine != theirs[:max_len]:
                    logger.info("the tokenizer's own __call__ differs from its backend; tokenizing "
                                "through __call__ (no early stop at max_model_len)")
                    return None
        return copy
    except Exception:  # noqa: BLE001 - any surprise: use the tokenizer as it is
        logger.debug("no truncating tokenizer copy", exc_info=True)
        return None


class Preprocessor:
    """Tokenize and render chat templates in ``workers`` threads, with the cheap checks first."""

    def __init__(self, tokenizer: Any, max_model_len: int, *, workers: int = DEFAULT_WORKERS,
                 trust_request_chat_template: bool = False,
                 template_timeout: float = DEFAULT_TEMPLATE_TIMEOUT, fallback_render_cap: int = 1 << 24):
        if workers < 1:
            raise ValueError("workers must be positive")
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.trust_request_chat_template = trust_request_chat_template
        self.template_timeout = template_timeout
        self.max_prompt_chars = prompt_char_bound(tokenizer, max_model_len)
        self.max_rendered_chars = self.max_prompt_chars or fallback_render_cap
        self._fast = _truncating_copy(tokenizer, max_model_len)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="specserve-preprocess")

    def describe(self) -> str:
        return (f"prompt pre-check {self.max_prompt_chars or 'off'} characters; rendered prompts up to "
                f"{self.max_rendered_chars} characters; tokenization "
                f"{'stops at max_model_len' if self._fast else 'through the tokenizer'}")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- checks ------------------------------------------------------------------------
    def check_length(self, chars: int, param: str) -> None:
        """Refuse a text that has more than max_model_len tokens whatever it says (cheap: a length)."""
        bound = self.max_prompt_chars
        if bound is not None and chars > bound:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the "
                                f"{param} has {chars} characters, which is more than {self.max_model_len} "
                                f"tokens for this tokenizer (at most {bound} characters can fit)",
                           param=param, code="invalid_value")

    # ---- tokenization ------------------------------------------------------------------
    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._fast is not None:
            return self._fast.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return list(self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    async def tokenize(self, text: str, param: str, add_special_tokens: bool) -> list[int]:
        self.check_length(len(text), param)
        ids = await self.run(self._encode, text, add_special_tokens)
        if not ids:
            raise bad_request(f"{param} is empty: at least one token is needed", param=param)
        if self._fast is not None and len(ids) >= self.max_model_len:
            raise APIError(400, f"this model's maximum context length is {self.max_model_len} tokens; the "
                                f"{param} has at least {len(ids)} tokens, leaving no room to generate",
                           param=param, code="invalid_value")
        return ids

    # ---- chat templates ----------------------------------------------------------------
    async def render_chat(self, messages: list[dict[str, Any]], kwargs: dict[str, Any],
                          request_template: Optional[str]) -> str:
        """The prompt text of ``messages``: the model's template (in a worker thread) or, when the
        client sent one and the server trusts it, the client's (in a limited child process)."""
        self.check_length(sum(len(m.get("content") or "") for m in messages), "messages")
        if request_template is None:
            text = await self.run(self._render_model_template, messages, kwargs)
        else:
            text = await self.run(self._render_request_template, request_template, messages, kwargs)
        if len(text) > self.max_rendered_chars:
            raise APIError(400, f"the rendered chat prompt has {len(text)} characters; at most "
                                f"{self.max_rendered_chars} can fit this model's maximum context length "
                                f"of {self.max_model_len} tokens", param="messages", code="invalid_value")
        return text

    def _render_model_template(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        try:
            text = self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as e:  # noqa: BLE001 - template errors are the request's fault (roles, kwargs)
            raise bad_request(f"the chat template could not render these messages: {e}", "messages") from None
        if not isinstance(text, str):
            raise bad_request("chat_template_kwargs must not change the template's output type",
                              "chat_template_kwargs")
        return text

    def _render_request_template(self, source: str, messages: list[dict[str, Any]],
                                 kwargs: dict[str, Any]) -> str:
        variables = {k: v for k, v in kwargs.items() if k not in ("tokenize", "continue_final_message")}
        variables.update({k: v for k, v in _special_tokens(self.tokenizer).items() if k not in variables})
        variables["messages"] = messages
        limits = RenderLimits(max_chars=self.max_rendered_chars, timeout=self.template_timeout)
        try:
            text = render_blocking(source, variables, limits)
            if kwargs.get("continue_final_message"):
                text = continue_final_message(text, messages)
        except TemplateRenderError as e:
            raise APIError(400, f"the request's chat_template could not be rendered: {e.message}",
                           param="chat_template", code=f"chat_template_{e.reason}") from None
        return text


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    """bos_token, eos_token, ... as the chat template sees them (strings only: JSON travels)."""
    tokens = getattr(tokenizer, "special_tokens_map", None) or {}
    return {k: v for k, v in tokens.items() if isinstance(v, str)}
