"""Raw HTTP against the live server: token-id prompts, SSE framing, echo, usage options, auth,
and a table of bad inputs that must each get the right status and OpenAI error shape."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import API_KEY, API_KEY_2, MAX_MODEL_LEN, MODEL

GOOD = {"model": MODEL, "prompt": "def add", "max_tokens": 4, "temperature": 0}


def sse_events(response: httpx.Response) -> list[bytes]:
    """The raw ``data:`` payloads of an SSE response, checking the framing on the way."""
    raw = b"".join(response.iter_bytes())
    assert raw.endswith(b"\n\n")
    events = raw[:-2].split(b"\n\n")
    for event in events:
        assert event.startswith(b"data: ") and b"\n" not in event, event
    return [e[len(b"data: "):] for e in events]


def stream_json(http: httpx.Client, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = sse_events(r)
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p.decode("utf-8")) for p in payloads[:-1]]  # strict UTF-8 per event


def test_token_id_prompts_and_return_token_ids(http: httpx.Client) -> None:
    ids_a = http.post("/v1/completions", json={**GOOD, "return_token_ids": True}).json()
    prompt_ids = ids_a["choices"][0]["prompt_token_ids"]
    one = http.post("/v1/completions", json={**GOOD, "prompt": prompt_ids, "return_token_ids": True}).json()
    assert one["choices"][0]["token_ids"] == ids_a["choices"][0]["token_ids"]
    assert one["choices"][0]["text"] == ids_a["choices"][0]["text"]
    two = http.post("/v1/completions", json={**GOOD, "prompt": [prompt_ids, prompt_ids[:2]], "n": 2,
                                             "return_token_ids": True}).json()
    assert [c["index"] for c in two["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in two["choices"]] == [prompt_ids] * 2 + [prompt_ids[:2]] * 2
    assert two["choices"][0]["token_ids"] == ids_a["choices"][0]["token_ids"]
    assert two["usage"]["prompt_tokens"] == len(prompt_ids) + 2
    assert two["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in two["choices"])


def test_list_of_string_prompts_equal_single_requests(http: httpx.Client) -> None:
    prompts = ["def add", "class Point", "import os"]
    batch = http.post("/v1/completions", json={**GOOD, "prompt": prompts}).json()
    singles = [http.post("/v1/completions", json={**GOOD, "prompt": p}).json()["choices"][0]["text"]
               for p in prompts]
    assert [c["text"] for c in batch["choices"]] == singles


def test_sse_framing_usage_and_utf8(http: httpx.Client) -> None:
    body = {**GOOD, "prompt": "Grüße aus Köln, 東京 🚀", "max_tokens": 40, "temperature": 1.0, "seed": 3,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": True, "return_token_ids": True}
    chunks = stream_json(http, "/v1/completions", body)
    ids = [t for c in chunks for ch in c["choices"] for t in ch["token_ids"]]
    assert len(ids) == 40
    assert len({c["id"] for c in chunks}) == 1
    assert all("usage" in c for c in chunks)  # continuous usage: every chunk
    completion = [c["usage"]["completion_tokens"] for c in chunks]
    assert completion == sorted(completion) and completion[-1] == 40
    assert chunks[-1]["choices"] == []
    assert chunks[0]["choices"][0]["prompt_token_ids"]  # prompt ids come once, first
    assert all("prompt_token_ids" not in ch for c in chunks[1:] for ch in c["choices"])
    text = "".join(ch["text"] for c in chunks for ch in c["choices"])
    full = http.post("/v1/completions", json={**body, "stream": False, "stream_options": None}).json()
    assert text == full["choices"][0]["text"]


def test_echo(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={**GOOD, "echo": True}).json()
    plain = http.post("/v1/completions", json=GOOD).json()
    assert r["choices"][0]["text"] == GOOD["prompt"] + plain["choices"][0]["text"]
    chunks = stream_json(http, "/v1/completions", {**GOOD, "echo": True, "stream": True})
    assert "".join(ch["text"] for c in chunks for ch in c["choices"]) == r["choices"][0]["text"]


def test_chat_stream_role_first_then_content(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 6,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    chunks = stream_json(http, "/v1/chat/completions", body)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6 and "spec_decode" in chunks[-1]["usage"]


def test_open_endpoints_and_keys(server, http: httpx.Client) -> None:
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(server.url + path).status_code == 200
    assert httpx.get(server.url + "/version").json()["version"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert httpx.get(server.url + "/v1/models").status_code == 401
    second = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {API_KEY_2}"})
    assert second.status_code == 200  # the key from SPECSERVE_API_KEY


def test_unknown_fields_are_ignored_and_null_means_default(http: httpx.Client) -> None:
    r = http.post("/v1/completions", json={**GOOD, "guided_json": {"x": 1}, "priority": 3, "foo": [1]})
    assert r.status_code == 200
    nulls = {"temperature": None, "top_p": None, "n": None, "stream": None, "logprobs": None, "seed": None}
    r = http.post("/v1/completions", json={**GOOD, **nulls, "max_tokens": None})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 16  # OpenAI's default
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_completion_tokens": 2, **nulls,
                                                "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None
    r = http.post("/v1/chat/completions", json={"model": MODEL, "max_completion_tokens": 2,
                                                "messages": [{"role": "user", "content": "x", "extra": 1}],
                                                "parallel_tool_calls": False, "metadata": {"a": "b"}})
    assert r.status_code == 200


CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]
TOO_LONG = list(range(10, 10 + MAX_MODEL_LEN + 4))

# (id, path, json body or raw bytes, headers override, status, param, code)
BAD_INPUTS = [
    ("malformed-json", CMPL, b'{"prompt": "x",', None, 400, None, "invalid_json"),
    ("body-is-a-list", CMPL, b'[1, 2]', None, 400, None, "invalid_body"),
    ("no-content-type", CMPL, "form", None, 400, None, "invalid_body"),
    ("prompt-missing", CMPL, {"model": MODEL}, None, 400, "prompt", None),
    ("prompt-wrong-type", CMPL, {**GOOD, "prompt": 12}, None, 400, "prompt", None),
    ("prompt-mixed-list", CMPL, {**GOOD, "prompt": ["a", 1]}, None, 400, "prompt", None),
    ("prompt-empty-string", CMPL, {**GOOD, "prompt": ""}, None, 400, "prompt", None),
    ("prompt-empty-list", CMPL, {**GOOD, "prompt": []}, None, 400, "prompt", None),
    ("prompt-too-long", CMPL, {**GOOD, "prompt": TOO_LONG}, None, 400, "prompt", None),
    ("prompt-plus-max-tokens-too-long", CMPL, {**GOOD, "max_tokens": MAX_MODEL_LEN}, None, 400,
     "max_tokens", None),
    ("token-id-outside-vocab", CMPL, {**GOOD, "prompt": [1, 99999]}, None, 400, "prompt", None),
    ("lone-surrogate", CMPL, b'{"prompt": "a\\ud800b", "max_tokens": 2}', None, 400, "prompt", None),
    ("temperature-string", CMPL, {**GOOD, "temperature": "hot"}, None, 400, "temperature", None),
    ("temperature-too-high", CMPL, {**GOOD, "temperature": 2.5}, None, 400, "temperature", None),
    ("temperature-negative", CHAT, {"messages": MSG, "temperature": -0.1}, None, 400, "temperature", None),
    ("top-p-zero", CMPL, {**GOOD, "top_p": 0}, None, 400, "top_p", None),
    ("top-p-above-one", CHAT, {"messages": MSG, "top_p": 1.5}, None, 400, "top_p", None),
    ("max-tokens-zero", CMPL, {**GOOD, "max_tokens": 0}, None, 400, "max_tokens", None),
    ("max-tokens-string", CMPL, {**GOOD, "max_tokens": "ten"}, None, 400, "max_tokens", None),
    ("max-completion-tokens-negative", CHAT, {"messages": MSG, "max_completion_tokens": -1}, None, 400,
     "max_completion_tokens", None),
    ("n-zero", CMPL, {**GOOD, "n": 0}, None, 400, "n", None),
    ("n-fractional", CMPL, {**GOOD, "n": 1.5}, None, 400, "n", None),
    ("logprobs-too-many", CMPL, {**GOOD, "logprobs": 50}, None, 400, "logprobs", None),
    ("top-k-invalid", CMPL, {**GOOD, "top_k": -5}, None, 400, "top_k", None),
    ("messages-empty", CHAT, {"messages": []}, None, 400, "messages", None),
    ("messages-missing", CHAT, {"model": MODEL}, None, 400, "messages", None),
    ("messages-a-string", CHAT, {"messages": "hi"}, None, 400, "messages", None),
    ("role-unknown", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, None, 400, None, None),
    ("image-part", CHAT,
     {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     None, 400, "messages.0.content", None),
    ("unknown-model", CMPL, {**GOOD, "model": "gpt-9"}, None, 404, "model", "model_not_found"),
    ("stream-options-without-stream", CMPL, {**GOOD, "stream_options": {"include_usage": True}}, None,
     400, "stream_options", None),
    ("suffix", CMPL, {**GOOD, "suffix": "end"}, None, 400, "suffix", None),
    ("best-of-above-n", CMPL, {**GOOD, "best_of": 3}, None, 400, "best_of", None),
    ("echo-with-logprobs", CMPL, {**GOOD, "echo": True, "logprobs": 1}, None, 400, "echo", None),
    ("top-logprobs-without-logprobs", CHAT, {"messages": MSG, "top_logprobs": 2}, None, 400,
     "top_logprobs", None),
    ("logit-bias-bad-key", CMPL, {**GOOD, "logit_bias": {"abc": 1}}, None, 400, "logit_bias", None),
    ("logit-bias-outside-vocab", CMPL, {**GOOD, "logit_bias": {"99999": 1}}, None, 400, "logit_bias", None),
    # tool_choice "auto" (the default with tools) needs --enable-auto-tool-choice
    ("tools-auto-not-enabled", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]},
     None, 400, "tool_choice", None),
    ("unknown-response-format", CHAT, {"messages": MSG, "response_format": {"type": "xml"}}, None,
     400, "response_format", None),
    ("no-key", CMPL, GOOD, {}, 401, None, "invalid_api_key"),
    ("wrong-key", CMPL, GOOD, {"Authorization": "Bearer sk-wrong"}, 401, None, "invalid_api_key"),
    ("basic-scheme", CMPL, GOOD, {"Authorization": f"Basic {API_KEY}"}, 401, None, "invalid_api_key"),
    ("key-prefix-only", CHAT, {"messages": MSG}, {"Authorization": f"Bearer {API_KEY[:-1]}"}, 401, None,
     "invalid_api_key"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs_get_openai_errors(server, case) -> None:
    _, path, body, headers, status, param, code = case
    hdrs = {"Authorization": f"Bearer {API_KEY}"} if headers is None else headers
    if isinstance(body, bytes):
        r = httpx.post(server.url + path, content=body, headers={**hdrs, "Content-Type": "application/json"})
    elif body == "form":
        r = httpx.post(server.url + path, content=b"prompt=x", headers=hdrs)
    else:
        r = httpx.post(server.url + path, json=body, headers=hdrs)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    if status == 401:
        assert r.headers.get("www-authenticate") == "Bearer"
    # and the server keeps serving
    ok = httpx.post(server.url + CMPL, json={**GOOD, "max_tokens": 1},
                    headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200


def test_length_errors_name_the_limits(http: httpx.Client) -> None:
    err = http.post(CMPL, json={**GOOD, "prompt": TOO_LONG}).json()["error"]
    assert str(MAX_MODEL_LEN) in err["message"] and str(len(TOO_LONG)) in err["message"]
    err = http.post(CMPL, json={**GOOD, "max_tokens": MAX_MODEL_LEN}).json()["error"]
    assert str(MAX_MODEL_LEN) in err["message"]


def test_unknown_route_and_method_are_openai_shaped(server) -> None:
    r = httpx.get(server.url + "/v1/nothing-here", headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(server.url + CMPL, headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 405 and "error" in r.json()
