"""The ``usage`` block of a response, and what a stream's ``stream_options`` asks of it."""

from __future__ import annotations

from typing import Any, Optional

from specserve.engine.types import RequestOutput, SpecDecodeStats
from specserve.server.protocol import PromptTokensDetails, SpecDecodeUsage, Usage


def usage_of(spec_enabled: bool, prompt_lens: list[int],
             outputs: list[Optional[RequestOutput]]) -> Usage:
    """Usage over all prompts and choices; ``spec_decode`` (only when the server speculates)
    merges the per-sequence counters; ``prompt_tokens_details.cached_tokens`` counts each
    prompt's prefix-cache hits once (as ``prompt_tokens`` counts each prompt once)."""
    completion = cached = 0
    spec = SpecDecodeStats()
    for out in outputs:
        if out is not None:
            cached += out.num_cached_prompt_tokens
        for comp in (out.outputs if out is not None else []):
            completion += len(comp.token_ids)
            spec.merge(comp.spec_decode)
    prompt = sum(prompt_lens)
    block = SpecDecodeUsage(**spec.as_dict()) if spec_enabled else None
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached), spec_decode=block)


def usage_options(opts: Any) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) of a request's ``stream_options`` (may be None)."""
    include = bool(opts and opts.include_usage)
    return include, include and bool(opts and opts.continuous_usage_stats)
