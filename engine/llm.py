"""The offline API: ``LLM(model=..., draft_model=...).generate(prompts, params)``."""

from __future__ import annotations

import itertools
from typing import Optional, Sequence, Union

from specserve.engine.config import EngineConfig, SpeculativeConfig
from specserve.engine.core import EngineCore
from specserve.engine.types import RequestOutput, SamplingParams

Prompt = Union[str, list[int]]


def make_config(model: str, draft_model: Optional[str] = None,
                num_speculative_tokens: Optional[int] = None,
                speculative_config: Optional[Union[str, dict]] = None,
                rejection_sample_method: str = "probabilistic",
                draft_sample_method: str = "sample", speculative_k: str = "adaptive",
                **engine_kwargs) -> EngineConfig:
    """Build an EngineConfig from the same options the CLI takes (vLLM's spellings accepted)."""
    if speculative_config is not None:
        import json

        text = speculative_config if isinstance(speculative_config, str) else json.dumps(speculative_config)
        spec = SpeculativeConfig.from_json(text)
    elif draft_model is not None:
        k = 4 if num_speculative_tokens is None else num_speculative_tokens
        spec = SpeculativeConfig(draft_model, k, rejection_sample_method, draft_sample_method,
                                 speculative_k)
    else:
        spec = SpeculativeConfig()
    return EngineConfig(model=model, speculative=spec, **engine_kwargs)


class LLM:
    """Synchronous generation over a whole batch of prompts, with continuous batching inside."""

    def __init__(self, model: str = "demo", draft_model: Optional[str] = None,
                 num_speculative_tokens: Optional[int] = None, **kwargs):
        self.config = make_config(model, draft_model, num_speculative_tokens, **kwargs)
        self.core = EngineCore(self.config)
        self.tokenizer = self.core.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 params: Union[SamplingParams, Sequence[SamplingParams], None] = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        params = params or SamplingParams()
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams or one per prompt")
        encoded = [self.tokenizer.encode(x) if isinstance(x, str) else list(x) for x in prompts]
        for ids, p in zip(encoded, plist):  # all or nothing: refuse before anything is queued
            self.core.validate(ids, p)
        order = []
        done: dict[str, RequestOutput] = {}
        try:
            for prompt, ids, p in zip(prompts, encoded, plist):
                rid = f"llm-{next(self._ids)}"
                self.core.add_request(rid, ids, p, prompt if isinstance(prompt, str) else None,
                                      final_only=True)   # only the finished outputs are read
                order.append(rid)
            while self.core.has_unfinished():
                outputs, _ = self.core.step()
                for out in outputs:
                    if out.finished:
                        done[out.request_id] = out
        finally:  # an error leaves nothing behind for the next call
            self.core.abort([rid for rid in order if rid not in done])
        return [done[rid] for rid in order]
