"""What a request asks its output to match: a JSON schema, any JSON object, a regex, a choice of
strings, or a grammar (Lark or GBNF). Plain Python, no grammar engine: this travels inside
SamplingParams across the event loop / engine thread boundary.

The server maps OpenAI's ``response_format`` and vLLM's ``structured_outputs`` onto it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

from specserve.engine.types import ParamError

KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputs:
    """Exactly one constraint. ``json``: a JSON schema (dict or its JSON text); ``json_object``:
    any JSON object; ``regex``; ``choice``: a list of strings; ``grammar``: Lark or GBNF text."""

    json: Optional[Any] = None
    json_object: bool = False
    regex: Optional[str] = None
    choice: Optional[tuple[str, ...]] = None
    grammar: Optional[str] = None

    def __post_init__(self) -> None:
        given = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(given) != 1:
            raise ParamError("structured_outputs", "give exactly one of json, json_object, regex, "
                             f"choice or grammar (got {', '.join(given) or 'none'})")
        if self.json is not None:
            schema = self.json
            if isinstance(schema, str):
                try:
                    schema = json.loads(schema)
                except ValueError as e:
                    raise ParamError("structured_outputs", f"the JSON schema is not valid JSON: {e}") from None
            if not isinstance(schema, (dict, bool)):
                raise ParamError("structured_outputs", "a JSON schema must be an object")
            object.__setattr__(self, "json", schema)
        if self.choice is not None:
            choice = tuple(self.choice)
            if not choice or not all(isinstance(c, str) and c for c in choice):
                raise ParamError("structured_outputs", "choice must be a non-empty list of non-empty strings")
            object.__setattr__(self, "choice", choice)
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ParamError("structured_outputs", f"{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    def key(self) -> tuple[str, str]:
        """A hashable identity (kind, canonical text): the compiled-grammar cache key."""
        kind = self.kind
        if kind == "json":
            return kind, json.dumps(self.json, sort_keys=True, separators=(",", ":"))
        if kind == "json_object":
            return kind, ""
        if kind == "choice":
            return kind, json.dumps(list(self.choice))
        return kind, getattr(self, kind)
