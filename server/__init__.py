"""specserve's HTTP face: an OpenAI-compatible FastAPI server over :mod:`engine`.

Modules: ``protocol`` (pydantic request/response schemas), ``errors`` (OpenAI-shaped errors),
``auth`` (bearer keys), ``tokens`` (token text/bytes and clamped values for logprobs), ``state``
(``ServerState``: what every endpoint needs), ``prompt_text`` (text checks, tokenization),
``sampling`` (request fields -> SamplingParams), ``generation`` (one HTTP request's engine
requests: started, read and aborted together), ``usage`` (the usage block), ``deltas`` (what a
stream has sent of each choice), ``sse`` (event framing), ``disconnect`` (client gone -> work
cancelled), ``respond`` (the tail both endpoints share: a Generation -> an SSE stream or one body),
``serving_completions`` / ``serving_chat`` (the two generation endpoints: RequestOutput -> OpenAI
bodies and stream chunks), ``routes`` (the endpoints), ``metrics`` (the only prometheus_client user),
``app`` (``create_app(engine, ...)``) and ``cli`` (``specserve serve``; argv/env -> configs).
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path


def _version() -> str:
    try:
        return metadata.version("specserve")
    except metadata.PackageNotFoundError:  # a source checkout that was not pip-installed
        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return tomllib.loads(pyproject.read_text())["project"]["version"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "unknown"


__version__ = _version()
