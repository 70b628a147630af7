"""What every endpoint shares: the engine, its tokenizer, the served model names and the metrics."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from specserve.server.errors import APIError
from specserve.server.metrics import ServerMetrics
from specserve.server.tokens import TokenText


@dataclass
class ServerState:
    """What every endpoint needs: the engine, its tokenizer, the served names and the metrics.

    ``served_model_name`` is the first of ``served_model_names``: responses report it, requests
    may name any of them.
    """

    engine: Any
    served_model_name: str
    metrics: ServerMetrics
    token_text: TokenText
    served_model_names: tuple[str, ...] = ()
    preprocess: Any = None  # a Preprocessor: tokenization and chat templates off the event loop

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def spec_enabled(self) -> bool:
        return self.engine.info.num_speculative_tokens > 0

    @property
    def generation_defaults(self) -> Mapping[str, Any]:
        """Request defaults from the model's generation config (``--generation-config``)."""
        return self.engine.info.generation_defaults

    def check_model(self, name: Optional[str]) -> None:
        if name is None or name in (self.served_model_name, *self.served_model_names,
                                    self.engine.info.model_path):
            return
        raise APIError(404, f"the model '{name}' does not exist; this server serves "
                            f"'{self.served_model_name}'", param="model", code="model_not_found")
