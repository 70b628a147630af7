"""Client side of the reliability tests: one request -> its choices, streamed or not, both APIs.

``run_request`` returns the same :class:`Outcome` whichever way the answer came (a JSON body or
an SSE stream), so results can be compared across modes and with one-at-a-time runs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import httpx


@dataclass
class Choice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Any = None


@dataclass
class Outcome:
    status: int
    choices: dict[int, Choice] = field(default_factory=dict)
    error: Optional[dict] = None          # an HTTP error body, or an error event inside a stream
    usage: Optional[dict] = None
    seconds: float = 0.0
    done_marker: bool = False             # a stream ended with data: [DONE]
    retry_after: Optional[str] = None     # the Retry-After header of an error response

    def signature(self) -> list[tuple[int, str, tuple[int, ...], Optional[str]]]:
        """What must be identical between two runs of the same greedy or seeded request."""
        return [(i, c.text, tuple(c.token_ids), c.finish_reason) for i, c in sorted(self.choices.items())]


def _absorb(choices: dict[int, Choice], raw: dict, chat: bool) -> None:
    """Add one choice object (a full one or a stream delta) to ``choices``."""
    c = choices.setdefault(raw["index"], Choice())
    if chat:
        part = raw.get("delta") if "delta" in raw else raw.get("message")
        c.text += (part or {}).get("content") or ""
    else:
        c.text += raw.get("text") or ""
    c.token_ids += raw.get("token_ids") or []
    if raw.get("finish_reason") is not None:
        c.finish_reason = raw["finish_reason"]
        c.stop_reason = raw.get("stop_reason")


async def _read_stream(response: httpx.Response, out: Outcome, chat: bool) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        payload = line[len("data: "):]
        if payload == "[DONE]":
            out.done_marker = True
            continue
        event = json.loads(payload)
        if "error" in event:
            out.error = event["error"]
            continue
        for raw in event.get("choices", []):
            _absorb(out.choices, raw, chat)
        if event.get("usage"):
            out.usage = event["usage"]


async def run_request(client: httpx.AsyncClient, path: str, body: dict) -> Outcome:
    """POST ``body`` to ``path`` (``/v1/completions`` or ``/v1/chat/completions``)."""
    chat = path.endswith("chat/completions")
    t0 = time.monotonic()
    if body.get("stream"):
        async with client.stream("POST", path, json=body) as r:
            out = Outcome(r.status_code)
            if r.status_code == 200:
                await _read_stream(r, out, chat)
            else:
                await r.aread()
                out.error = r.json().get("error")
                out.retry_after = r.headers.get("retry-after")
    else:
        r = await client.post(path, json=body)
        out = Outcome(r.status_code)
        data = r.json()
        if r.status_code == 200:
            for raw in data["choices"]:
                _absorb(out.choices, raw, chat)
            out.usage = data.get("usage")
        else:
            out.error = data.get("error")
            out.retry_after = r.headers.get("retry-after")
    out.seconds = time.monotonic() - t0
    return out
