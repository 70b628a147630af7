"""Structured outputs and tool calls through a real uvicorn server (tiny target + draft, k = 3,
``--enable-auto-tool-choice --tool-call-parser hermes``) with the openai client: response_format
json_schema / json_object, ``chat.completions.parse`` with a pydantic model, vLLM's
structured_outputs on completions and chat, tool_choice required (parallel) / named / auto / none,
streamed tool_calls deltas equal to the non-streamed calls, tool results rendered by the chat
template, refusals. Parser and stream units at the end."""

from __future__ import annotations

import json
from typing import Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from specserve.server.tools import ToolPlan, ToolStreamer, parse_hermes, parse_llama3_json
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint
from tests.server.live import LiveServer

TEMPLATE = (
    "{%- if tools %}<|system|>\n# Tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|user|>\n<tool_response>{{ m.content }}</tool_response><|end|>\n"
    "{%- elif m.tool_calls %}<|assistant|>\n{% for c in m.tool_calls %}<tool_call>{\"name\": "
    "\"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}<|end|>\n"
    "{%- else %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 9}},
           "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("tools")
    target = make_tiny_checkpoint(root / "target", "llama", seed=11, initializer_range=0.2,
                                  max_position_embeddings=2048)
    tok = AutoTokenizer.from_pretrained(str(target))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(target))
    draft = make_perturbed_copy(target, root / "draft", noise=0.01, seed=2)
    argv = ["--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", "3",
            "--device", "cpu", "--max-model-len", "2048", "--served-model-name", "tiny",
            "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    with LiveServer(argv) as live:
        yield live


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)


def _chat(client, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_completion_tokens", 120)
    return client.chat.completions.create(model="tiny", messages=kw.pop("messages", MESSAGES), **kw)


# ---- structured outputs ------------------------------------------------------------------------
def test_response_format_json_schema_gives_schema_valid_json(client, server):
    r = _chat(client, response_format={"type": "json_schema",
                                       "json_schema": {"name": "weather", "schema": WEATHER, "strict": True}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), WEATHER)
    assert r.usage.spec_decode is not None   # a speculative server (the engine tests check acceptance)
    assert server.wait_idle()["num_unfinished_requests"] == 0


class Forecast(pydantic.BaseModel):
    city: Literal["Paris", "Oslo"]
    rain: bool
    days: int = pydantic.Field(ge=1, le=7)


def test_openai_parse_helper_with_a_pydantic_model(client):
    r = client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Forecast,
                                      temperature=0.7, seed=3, max_completion_tokens=120)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Forecast)


def test_json_object_and_vllm_structured_outputs(client):
    r = _chat(client, response_format={"type": "json_object"}, max_completion_tokens=200)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    r = _chat(client, extra_body={"structured_outputs": {"regex": "[a-c]{2}-[0-9]{3}"}})
    assert len(r.choices[0].message.content) == 6 and r.choices[0].message.content[2] == "-"
    c = client.completions.create(model="tiny", prompt="Pick:", max_tokens=10, temperature=1.0, seed=1,
                                  n=4, extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}})
    assert {ch.text for ch in c.choices} <= {"alpha", "beta"}
    c = client.completions.create(model="tiny", prompt="JSON:", max_tokens=100, temperature=0,
                                  extra_body={"response_format": {"type": "json_schema",
                                                                  "json_schema": {"name": "t", "schema": TIME}}})
    assert json.loads(c.choices[0].text)["zone"] in ("UTC", "CET")


@pytest.mark.parametrize("body", [
    {"structured_outputs": {"regex": "(unclosed"}},
    {"structured_outputs": {"regex": "a", "choice": ["b"]}},
    {"structured_outputs": {"json": {"type": "objectx"}}},
    {"response_format": {"type": "xml"}},
    {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    {"tool_choice": "required"},
])
def test_bad_constraints_are_400(server, body):
    r = httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": MESSAGES, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


# ---- tool calls ---------------------------------------------------------------------------------
def _check_calls(calls, allowed=SCHEMAS):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        jsonschema.validate(json.loads(c.function.arguments), allowed[c.function.name])


def test_tool_choice_required_always_parses(client):
    for seed in range(3):
        r = _chat(client, tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                  max_completion_tokens=200)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        _check_calls(choice.message.tool_calls)


def test_tool_choice_named_always_parses(client):
    r = _chat(client, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather"]
    _check_calls(calls)


def _streamed_calls(client, **kw) -> tuple[list[dict], str]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in _chat(client, stream=True, **kw):
        for ch in chunk.choices:
            finish = ch.finish_reason or finish
            for d in ch.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                entry["id"] = d.id or entry["id"]
                if d.function is not None:
                    entry["name"] += d.function.name or ""
                    entry["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_streamed_tool_calls_equal_the_non_streamed_ones(client, choice):
    plain = _chat(client, tools=TOOLS, tool_choice=choice, max_completion_tokens=200).choices[0]
    streamed, finish = _streamed_calls(client, tools=TOOLS, tool_choice=choice, max_completion_tokens=200)
    assert finish == plain.finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in plain.message.tool_calls]
    assert all(c["id"] and c["id"].startswith("call_") for c in streamed)


def test_auto_and_none_and_tool_results_rendered_by_the_template(client, server):
    r = _chat(client, tools=TOOLS, tool_choice="auto", max_completion_tokens=16)
    assert r.choices[0].finish_reason != "tool_calls" or r.choices[0].message.tool_calls
    r = _chat(client, tools=TOOLS, tool_choice="none", max_completion_tokens=8)
    assert r.choices[0].message.tool_calls is None
    follow = MESSAGES + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21C"}]
    body = {"model": "tiny", "messages": follow, "tools": TOOLS, "max_tokens": 4, "temperature": 0,
            "return_token_ids": True}
    out = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60).json()
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(server.engine.config.model).decode(out["prompt_token_ids"])
    assert "<tool_response>sunny, 21C</tool_response>" in prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}</tool_call>' in prompt
    assert '"name": "get_time"' in prompt   # the tools themselves


# ---- parsers and the stream, without a model ----------------------------------------------------
def test_parsers():
    content, calls = parse_hermes('Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>'
                                  '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in calls] == [("a", {"x": 1}), ("b", {})]
    assert parse_hermes("no calls here") == ("no calls here", [])
    assert parse_hermes("<tool_call>{broken")[1] == []
    content, calls = parse_llama3_json('{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y": "z"}}')
    assert content is None and [c.name for c in calls] == ["a", "b"] and json.loads(calls[1].arguments) == {"y": "z"}
    assert parse_llama3_json("plain text")[1] == []


def test_auto_stream_passes_content_then_holds_a_call():
    plan = ToolPlan(request=None, mode="auto", parser="hermes")
    s = ToolStreamer(plan)
    text = 'Sure. <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>'
    pieces = [text[i:i + 4] for i in range(0, len(text), 4)]
    deltas = [s.delta(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert "".join(d.get("content", "") for d in deltas) == "Sure. "
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["function"]["name"], c["index"]) for c in calls] == [("a", 0)]
    assert s.finish_reason("stop") == "tool_calls"
    s = ToolStreamer(plan)
    deltas = [s.delta(p, i == 2) for i, p in enumerate(["a <tool", "_ca", "t> b"])]
    assert "".join(d.get("content", "") for d in deltas) == "a <tool_cat> b"
