"""Structured outputs and tool calls at the API edge: request fields -> StructuredOutputs, model
text -> ``tool_calls``.

- ``response_format`` (OpenAI: ``text`` | ``json_object`` | ``json_schema``) and vLLM's
  ``structured_outputs`` (``json`` | ``regex`` | ``choice`` | ``grammar``; also ``json_object``)
  become the engine's :class:`StructuredOutputs` (:func:`structured_from`).
- Tool calls (:class:`ToolPlan`): ``tool_choice`` ``"none"`` ignores the tools; ``"auto"`` renders
  them with the chat template and parses the reply with the server's ``--tool-call-parser``
  (needs ``--enable-auto-tool-choice``, as in vLLM); ``"required"`` and a named function constrain
  the reply with a JSON schema, so the calls always parse: ``required`` generates a JSON array of
  ``{"name", "parameters"}`` objects (one or more: parallel calls), a named function generates
  its arguments object.
- Parsers: ``hermes`` (Hermes / Qwen: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks, any number) and ``llama3_json`` (the reply is a JSON object ``{"name", "parameters"}``,
  or several separated by ``;``).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from specserve.engine.structured.params import StructuredOutputs
from specserve.engine.types import ParamError, SamplingParams
from specserve.server.errors import bad_request, from_engine_error

PARSERS = ("hermes", "llama3_json")


@dataclass(frozen=True)
class ToolOptions:
    """The server's tool-call settings (vLLM's flags of the same names)."""

    enable_auto_tool_choice: bool = False
    tool_call_parser: Optional[str] = None

    def __post_init__(self) -> None:
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(PARSERS)}")
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")

    @staticmethod
    def from_args(args: Any) -> "ToolOptions":
        return ToolOptions(bool(getattr(args, "enable_auto_tool_choice", False)),
                           getattr(args, "tool_call_parser", None))


def add_tool_flags(group: Any) -> None:
    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="let the model decide to call tools (tool_choice 'auto'); needs --tool-call-parser")
    group.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                       help="how tool calls are written by the model: hermes (Hermes/Qwen <tool_call> "
                            "JSON) or llama3_json")


# ---- structured outputs from request fields -------------------------------------------------------
def _from_response_format(rf: Any) -> Optional[StructuredOutputs]:
    if not isinstance(rf, dict):
        raise bad_request("response_format must be an object", "response_format")
    kind = rf.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputs(json_object=True)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise bad_request("response_format json_schema needs {'name', 'schema'}", "response_format")
        return StructuredOutputs(json=spec.get("schema") or {"type": "object"})
    raise bad_request(f"response_format type must be text, json_object or json_schema, got {kind!r}",
                      "response_format")


def _from_extra(so: Any) -> Optional[StructuredOutputs]:
    if not isinstance(so, dict):
        raise bad_request("structured_outputs must be an object", "structured_outputs")
    fields = {k: so[k] for k in ("json", "regex", "choice", "grammar", "json_object") if so.get(k) is not None}
    if not fields:
        return None
    return StructuredOutputs(**fields)


def structured_from(req: Any) -> Optional[StructuredOutputs]:
    """The constraint a completion or chat request asks for (None: none); 400 when malformed or
    when both ``response_format`` and ``structured_outputs`` constrain."""
    try:
        a = _from_response_format(req.response_format) if getattr(req, "response_format", None) else None
        b = _from_extra(req.structured_outputs) if getattr(req, "structured_outputs", None) else None
    except ParamError as e:
        raise from_engine_error(e) from None
    if a is not None and b is not None:
        raise bad_request("give response_format or structured_outputs, not both", "structured_outputs")
    return a or b


def constrain(params: SamplingParams, so: Optional[StructuredOutputs]) -> SamplingParams:
    return params if so is None else dataclasses.replace(params, structured_outputs=so)


# ---- tool calls -----------------------------------------------------------------------------------
@dataclass
class ToolCall:
    name: str
    arguments: str          # JSON text
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def as_dict(self, index: Optional[int] = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


def _call_from(obj: Any) -> Optional[ToolCall]:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):   # already JSON text
        return ToolCall(obj["name"], args)
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str) -> tuple[Optional[str], list[ToolCall]]:
    """(content before the first call or None, calls). Unparseable blocks leave the text as content."""
    start = text.find("<tool_call>")
    if start < 0:
        return text, []
    calls = []
    for block in _HERMES.findall(text[start:]):
        try:
            call = _call_from(json.loads(block))
        except ValueError:
            return text, []
        if call is None:
            return text, []
        calls.append(call)
    content = text[:start].strip()
    return (content or None), calls


def parse_llama3_json(text: str) -> tuple[Optional[str], list[ToolCall]]:
    """The whole reply is ``{"name": ..., "parameters": {...}}`` (several joined by ``;``)."""
    body = text.strip()
    if body.startswith("<|python_tag|>"):
        body = body[len("<|python_tag|>"):].strip()
    if not body.startswith("{"):
        return text, []
    decoder, calls, i = json.JSONDecoder(), [], 0
    while i < len(body):
        try:
            obj, end = decoder.raw_decode(body, i)
        except ValueError:
            return text, []
        call = _call_from(obj)
        if call is None:
            return text, []
        calls.append(call)
        i = end
        while i < len(body) and body[i] in " \t\r\n;":
            i += 1
    return None, calls


PARSE: dict[str, Callable[[str], tuple[Optional[str], list[ToolCall]]]] = {
    "hermes": parse_hermes, "llama3_json": parse_llama3_json}
# a reply that may still become a tool call is held back from the stream once it shows this
_CALL_START = {"hermes": "<tool_call>", "llama3_json": "{"}


def _function_names(tools: list[dict]) -> dict[str, dict]:
    out = {}
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict) \
                or not isinstance(fn.get("name"), str):
            raise bad_request(f"tools[{i}] must be {{'type': 'function', 'function': {{'name', ...}}}}", "tools")
        out[fn["name"]] = fn.get("parameters") or {"type": "object", "properties": {}}
    return out


def required_schema(functions: dict[str, dict], parallel: bool) -> dict:
    """A JSON array of one or more calls, each ``{"name": <a tool>, "parameters": <its schema>}``."""
    one = {"anyOf": [{"type": "object", "properties": {"name": {"const": name}, "parameters": params},
                      "required": ["name", "parameters"], "additionalProperties": False}
                     for name, params in functions.items()]}
    schema = {"type": "array", "items": one, "minItems": 1}
    if not parallel:
        schema["maxItems"] = 1
    return schema


@dataclass
class ToolPlan:
    """How one chat request treats tools and constraints, from prompt to reply."""

    request: Any                                   # the chat request, tools placed for the template
    structured: Optional[StructuredOutputs] = None
    mode: str = "off"                              # off | auto | required | named
    parser: Optional[str] = None
    named: Optional[str] = None

    @classmethod
    def for_request(cls, state: Any, req: Any) -> "ToolPlan":
        options: ToolOptions = getattr(state, "tools", None) or ToolOptions()
        so = structured_from(req)
        choice = req.tool_choice if req.tool_choice is not None else ("auto" if req.tools else "none")
        if not req.tools or choice == "none":
            if isinstance(choice, dict) or choice in ("required",):
                raise bad_request(f"tool_choice {choice!r} needs tools", "tool_choice")
            return cls(req, so)
        functions = _function_names(req.tools)
        if so is not None:
            raise bad_request("response_format / structured_outputs cannot be combined with tools", "tools")
        kwargs = dict(req.chat_template_kwargs or {})
        kwargs["tools"] = req.tools
        placed = req.model_copy(update={"chat_template_kwargs": kwargs})
        if choice == "auto":
            if not options.enable_auto_tool_choice:
                raise bad_request('tool_choice "auto" needs the server to run with --enable-auto-tool-choice '
                                  "and --tool-call-parser", "tool_choice")
            return cls(placed, None, "auto", options.tool_call_parser)
        if choice == "required":
            parallel = getattr(req, "parallel_tool_calls", True) is not False
            return cls(placed, StructuredOutputs(json=required_schema(functions, parallel)), "required")
        if isinstance(choice, dict):
            name = (choice.get("function") or {}).get("name")
            if name not in functions:
                raise bad_request(f"tool_choice names {name!r}, which is not in tools", "tool_choice")
            return cls(placed, StructuredOutputs(json=functions[name]), "named", named=name)
        raise bad_request('tool_choice must be "none", "auto", "required" or {"type": "function", ...}',
                          "tool_choice")

    def constrain(self, params: SamplingParams) -> SamplingParams:
        return constrain(params, self.structured)

    def parse(self, text: str) -> tuple[Optional[str], list[ToolCall]]:
        if self.mode == "named":
            return None, [ToolCall(self.named, text)]
        if self.mode == "required":
            try:
                calls = [_call_from(c) for c in json.loads(text)]
            except ValueError:   # cut off by max_tokens
                return text, []
            return None, [c for c in calls if c is not None]
        if self.mode == "auto":
            return PARSE[self.parser](text)
        return text, []

    def message(self, text: str) -> dict:
        content, calls = self.parse(text)
        if not calls:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": content, "tool_calls": [c.as_dict() for c in calls]}

    def finish_reason(self, text: str, reason: Any) -> str:
        if str(reason) == "stop" and self.mode != "off" and self.parse(text)[1]:
            return "tool_calls"
        return str(reason)

    def streamer(self) -> "ToolStreamer":
        return ToolStreamer(self)


class ToolStreamer:
    """One choice's stream: content deltas pass through until the reply may be a tool call; then
    the text is held and sent as ``tool_calls`` deltas. A named call streams its arguments as
    they are generated (the id and name first)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = 0            # characters of text already sent as content
        self.holding = plan.mode in ("required",)
        self.started = False     # named: the opening tool_calls delta was sent
        self.call_id = f"call_{uuid.uuid4().hex[:24]}"
        self.had_calls = False

    def delta(self, new_text: str, done: bool) -> dict:
        """The delta (as a dict for DeltaMessage) for ``new_text``, the choice's next text."""
        self.text += new_text
        plan = self.plan
        if plan.mode == "off":
            return {"content": new_text} if new_text else {}
        if plan.mode == "named":
            call = {"index": 0, "function": {"arguments": new_text}}
            if not self.started:
                self.started = True
                call.update(id=self.call_id, type="function")
                call["function"]["name"] = plan.named
            self.had_calls = True
            return {"tool_calls": [call]} if (new_text or call.get("id")) else {}
        if plan.mode == "auto" and not self.holding:
            marker = _CALL_START[plan.parser]
            at = self.text.find(marker) if plan.parser == "hermes" else (
                0 if self.text.lstrip().startswith(marker) else -1)
            keep = len(self.text) if at < 0 else at
            if at < 0:   # a marker may be starting at the end: hold its possible prefix back
                for n in range(min(len(marker) - 1, len(self.text)), 0, -1):
                    if plan.parser == "hermes" and marker.startswith(self.text[-n:]):
                        keep = len(self.text) - n
                        break
            out = self.text[self.sent:keep]
            self.sent = keep
            self.holding = at >= 0
            if not self.holding:
                if done:
                    out += self.text[self.sent:]
                    self.sent = len(self.text)
                return {"content": out} if out else {}
            if not done:
                return {"content": out} if out else {}
            return self._calls(out)
        if not done:
            return {}
        return self._calls("")

    def _calls(self, lead: str) -> dict:
        content, calls = self.plan.parse(self.text)
        if not calls:   # not a call after all: send the held text as content
            out = lead + self.text[self.sent:]
            self.sent = len(self.text)
            return {"content": out} if out else {}
        self.had_calls = True
        delta: dict = {"tool_calls": [c.as_dict(index=i) for i, c in enumerate(calls)]}
        if lead:
            delta["content"] = lead
        return delta

    def finish_reason(self, reason: Any) -> str:
        return "tool_calls" if str(reason) == "stop" and self.had_calls else str(reason)


def tool_fields(msg: Any) -> dict:
    """A request message's tool parts as chat templates expect them: an assistant's ``tool_calls``
    (arguments as objects, not JSON text) and a tool result's ``tool_call_id``."""
    out: dict = {}
    if getattr(msg, "tool_calls", None):
        calls = []
        for call in msg.tool_calls:
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"])
                except ValueError:
                    pass   # the template gets the text as sent
            calls.append({**call, "function": fn})
        out["tool_calls"] = calls
    if getattr(msg, "tool_call_id", None) is not None:
        out["tool_call_id"] = msg.tool_call_id
    return out
