"""specserve's engine: continuous batching over a paged KV cache with lossless speculative decoding.

Public API::

    from specserve.engine import LLM, SamplingParams            # offline
    from specserve.engine import AsyncEngine, EngineConfig        # what the server drives
"""

from specserve.engine.config import EngineConfig, SpeculativeConfig
from specserve.engine.types import (CompletionOutput, FinishReason, ParamError, RequestOutput, SamplingParams,
                          SpecDecodeStats, StepStats)


def __getattr__(name: str):
    # torch-heavy parts load lazily so that `import engine.types` stays cheap
    if name == "LLM":
        from specserve.engine.llm import LLM
        return LLM
    if name == "AsyncEngine":
        from specserve.engine.async_engine import AsyncEngine
        return AsyncEngine
    raise AttributeError(name)


__all__ = ["LLM", "AsyncEngine", "EngineConfig", "SpeculativeConfig", "SamplingParams",
           "RequestOutput", "CompletionOutput", "FinishReason", "ParamError", "SpecDecodeStats",
           "StepStats"]
