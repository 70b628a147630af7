"""Hostile input: every case gets a 400/413 with a message that says what is wrong, within bounded
time and memory, and the engine loop never notices (health, a normal request and an idle
/debug/state afterwards).

Limits used here: a 512 KiB body limit (``--max-request-body-bytes``), max_model_len 256, a
320-token vocabulary. Time bound per case: 5 s (each takes ~0.1 s; the machine is shared).
Memory bound: the server's resident set grows by less than 200 MiB over all the cases.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

import httpx
import pytest

from tests.reliability.conftest import API_KEY, BODY_LIMIT, MAX_MODEL_LEN
from tests.helpers.server_process import ServerProcess

VOCAB = 320
CASE_SECONDS = 5.0
RSS_GROWTH_MIB = 200
CMPL = "/v1/completions"
CHAT = "/v1/chat/completions"
G = {"model": "tiny", "prompt": "def add", "max_tokens": 2}
C = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2}

Body = Union[dict, bytes, Callable[[], Iterator[bytes]]]


def _raw(text: str) -> bytes:
    return text.encode("utf-8")


def _chunks(total: int, size: int = 64 * 1024) -> Callable[[], Iterator[bytes]]:
    """A chunked body (no Content-Length) of ``total`` bytes."""
    def gen() -> Iterator[bytes]:
        yield b'{"prompt": "'
        for _ in range(total // size):
            yield b"x" * size
        yield b'"}'
    return gen


# (id, path, body, status, words the message must contain, param or None)
CASES: list[tuple[str, str, Body, int, str, Optional[str]]] = [
    # size and shape of the body
    ("oversized body", CMPL, {**G, "prompt": "x" * (BODY_LIMIT + 1)}, 413, "exceeds", None),
    ("oversized chunked body", CMPL, _chunks(4 * BODY_LIMIT), 413, "exceeds", None),
    ("deeply nested JSON", CMPL, b'{"prompt": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", 400,
     "nested too deeply", None),
    ("nested objects in a field", CMPL, _raw('{"prompt": "a", "logit_bias": ' + '{"1": ' * 3000 + "1"
                                             + "}" * 3000 + "}"), 400, "nested too deeply", None),
    ("invalid UTF-8", CMPL, b'{"prompt": "\xff\xfe\xc3", "max_tokens": 1}', 400, "utf-8", None),
    ("lone surrogate", CMPL, _raw('{"prompt": "\\ud800", "max_tokens": 1}'), 400, "surrogate", "prompt"),
    ("5000-digit number", CMPL, _raw('{"prompt": "a", "max_tokens": ' + "9" * 5000 + "}"), 400,
     "digits", None),
    ("not an object", CMPL, b"[1, 2, 3]", 400, "json object", None),
    ("empty body", CMPL, b"", 400, "json object", None),
    # counts
    ("huge n", CMPL, {**G, "n": 10**9}, 400, "128", "n"),
    ("n = 129", CMPL, {**G, "n": 129}, 400, "128", "n"),
    ("huge logprobs", CMPL, {**G, "logprobs": 10**6}, 400, "20", "logprobs"),
    ("huge top_logprobs", CHAT, {**C, "logprobs": True, "top_logprobs": 10**6}, 400, "20", "top_logprobs"),
    ("10k stop strings", CMPL, {**G, "stop": [f"s{i}" for i in range(10_000)]}, 400, "64", "stop"),
    ("65 stop strings", CMPL, {**G, "stop": [f"s{i}" for i in range(65)]}, 400, "64", "stop"),
    ("empty stop string", CMPL, {**G, "stop": [""]}, 400, "non-empty", "stop"),
    ("20k-entry logit_bias", CMPL, {**G, "logit_bias": {str(i): 1.0 for i in range(20_000)}}, 400,
     "outside the vocabulary", "logit_bias"),
    ("logit_bias key not an id", CMPL, {**G, "logit_bias": {"1e3": 1.0}}, 400, "token ids", "logit_bias"),
    ("logit_bias beyond 100", CMPL, {**G, "logit_bias": {"5": 1e6}}, 400, "[-100, 100]", "logit_bias"),
    ("2000 prompts in one request", CMPL, {**G, "prompt": ["hi"] * 2000}, 400, "prompts", "prompt"),
    ("best_of huge", CMPL, {**G, "best_of": 10**9}, 400, "best_of", "best_of"),
    # token ids
    ("prompt id = vocab size", CMPL, {**G, "prompt": [5, VOCAB]}, 400, "outside the vocabulary", "prompt"),
    ("negative prompt id", CMPL, {**G, "prompt": [-1]}, 400, "outside the vocabulary", "prompt"),
    ("2^63 prompt id", CMPL, {**G, "prompt": [2**63]}, 400, "outside the vocabulary", "prompt"),
    ("10^30 prompt id in a batch", CMPL, {**G, "prompt": [[1, 2], [10**30]]}, 400, "outside the vocabulary",
     "prompt"),
    ("stop_token_ids out of vocab", CMPL, {**G, "stop_token_ids": [10**12]}, 400, "outside the vocabulary",
     "stop_token_ids"),
    ("logit_bias id out of vocab", CMPL, {**G, "logit_bias": {str(VOCAB): 1.0}}, 400, "outside the vocabulary",
     "logit_bias"),
    ("top_k beyond int32", CMPL, {**G, "top_k": 2**40}, 400, "top_k", "top_k"),
    ("seed beyond int64", CMPL, {**G, "seed": 2**70}, 400, "64-bit", "seed"),
    # lengths
    ("prompt ids over max_model_len", CMPL, {**G, "prompt": [5] * (MAX_MODEL_LEN + 10)}, 400,
     "maximum context length", "prompt"),
    ("prompt text over max_model_len", CMPL, {**G, "prompt": "def add(a, b): " * 400}, 400,
     "maximum context length", "prompt"),
    ("chat over max_model_len", CHAT, {**C, "messages": [{"role": "user", "content": "hello " * 600}]}, 400,
     "maximum context length", None),
    ("max_tokens beyond context", CMPL, {**G, "max_tokens": MAX_MODEL_LEN}, 400, "maximum context length",
     "max_tokens"),
    ("max_tokens 10^18", CMPL, {**G, "max_tokens": 10**18}, 400, "maximum context length", "max_tokens"),
    ("max_completion_tokens 10^12", CHAT, {**C, "max_completion_tokens": 10**12}, 400,
     "maximum context length", "max_tokens"),
    ("min_tokens over max_tokens", CMPL, {**G, "min_tokens": 10**9}, 400, "min_tokens", "min_tokens"),
    # NaN and infinities (Python's JSON reader accepts NaN / Infinity / 1e999)
    ("temperature NaN", CMPL, _raw('{"prompt": "a", "temperature": NaN}'), 400, "temperature", "temperature"),
    ("temperature Infinity", CMPL, _raw('{"prompt": "a", "temperature": Infinity}'), 400, "temperature",
     "temperature"),
    ("top_p -Infinity", CMPL, _raw('{"prompt": "a", "top_p": -Infinity}'), 400, "top_p", "top_p"),
    ("min_p NaN", CMPL, _raw('{"prompt": "a", "min_p": NaN}'), 400, "finite", "min_p"),
    ("repetition_penalty 1e999", CMPL, _raw('{"prompt": "a", "repetition_penalty": 1e999}'), 400,
     "repetition_penalty", "repetition_penalty"),
    ("presence_penalty NaN", CHAT, _raw('{"messages": [{"role": "user", "content": "a"}], '
                                        '"presence_penalty": NaN}'), 400, "presence_penalty", "presence_penalty"),
    ("logit_bias value NaN", CMPL, _raw('{"prompt": "a", "logit_bias": {"5": NaN}}'), 400, "finite",
     "logit_bias"),
    ("logit_bias value -Infinity", CMPL, _raw('{"prompt": "a", "logit_bias": {"5": -Infinity}}'), 400,
     "finite", "logit_bias"),
    ("max_tokens Infinity", CMPL, _raw('{"prompt": "a", "max_tokens": Infinity}'), 400, "max_tokens",
     "max_tokens"),
    ("seed NaN", CMPL, _raw('{"prompt": "a", "seed": NaN}'), 400, "seed", "seed"),
    # strict types (issue 16): no string -> number or number -> bool coercion
    ("max_tokens as a string", CMPL, {**G, "max_tokens": "4"}, 400, "valid integer", "max_tokens"),
    ("max_tokens true", CMPL, {**G, "max_tokens": True}, 400, "valid integer", "max_tokens"),
    ("max_tokens 4.0", CMPL, {**G, "max_tokens": 4.0}, 400, "valid integer", "max_tokens"),
    ("stream 'yes'", CMPL, {**G, "stream": "yes"}, 400, "valid boolean", "stream"),
    ("stream 1 (chat)", CHAT, {**C, "stream": 1}, 400, "valid boolean", "stream"),
    ("temperature as a string", CMPL, {**G, "temperature": "0.5"}, 400, "valid number", "temperature"),
    ("n as a string", CHAT, {**C, "n": "2"}, 400, "valid integer", "n"),
    ("logprobs 'true' (chat)", CHAT, {**C, "logprobs": "true"}, 400, "valid boolean", "logprobs"),
    ("include_usage 'yes'", CMPL, {**G, "stream": True, "stream_options": {"include_usage": "yes"}}, 400,
     "valid boolean", "stream_options.include_usage"),
    # chat templates sent by the client: refused without --trust-request-chat-template
    ("chat_template", CHAT, {**C, "chat_template": "{{ messages }}"}, 400, "trust-request-chat-template",
     "chat_template"),
    ("chat_template_kwargs.chat_template", CHAT, {**C, "chat_template_kwargs": {"chat_template":
     "{{ 'def f(x): ' * 1000000 }}"}}, 400, "trust-request-chat-template", "chat_template_kwargs.chat_template"),
    # big texts refused by their length in characters, before tokenization
    ("375 kB prompt", CMPL, {**G, "prompt": "def add(a, b): " * 25_000}, 400, "characters", "prompt"),
    ("360 kB chat message", CHAT, {**C, "messages": [{"role": "user", "content": "hello " * 60_000}]}, 400,
     "characters", "messages"),
]


@pytest.fixture()
def srv(main_srv: ServerProcess) -> ServerProcess:
    return main_srv


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _send(srv: ServerProcess, path: str, body: Body) -> tuple[httpx.Response, float]:
    headers = {"Authorization": f"Bearer {API_KEY}"}
    kwargs: dict[str, Any]
    if isinstance(body, dict):
        kwargs = {"json": body}
    else:
        headers["Content-Type"] = "application/json"
        kwargs = {"content": body() if callable(body) else body}
    t0 = time.monotonic()
    r = httpx.post(srv.url + path, headers=headers, timeout=30, **kwargs)
    return r, time.monotonic() - t0


def test_every_hostile_input_is_refused_clearly(srv: ServerProcess, ledger) -> None:
    httpx.post(srv.url + CMPL, json=G, headers=srv.headers, timeout=30).raise_for_status()  # warm up
    rss_before = _rss_mib(srv.proc.pid)
    failures, slowest = [], 0.0
    for name, path, body, status, words, param in CASES:
        r, seconds = _send(srv, path, body)
        slowest = max(slowest, seconds)
        error = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
        message = str(error.get("message", ""))
        if r.status_code != status or words.lower() not in message.lower() or seconds > CASE_SECONDS:
            failures.append(f"{name}: {r.status_code} in {seconds:.2f}s: {r.text[:300]}")
        elif set(error) != {"message", "type", "param", "code"} or (param and error["param"] != param):
            failures.append(f"{name}: not OpenAI-shaped or wrong param: {error}")
    rss_growth = _rss_mib(srv.proc.pid) - rss_before

    ledger.add("hostile input", "bad inputs tried", len(CASES))
    ledger.add("hostile input", "refused with 400/413 and a clear message", len(CASES) - len(failures))
    ledger.add("hostile input", "slowest answer s", round(slowest, 3))
    ledger.add("hostile input", "server RSS growth MiB", round(rss_growth, 1))
    assert not failures, "\n".join(failures)
    assert rss_growth < RSS_GROWTH_MIB
    _still_serving(srv)


def _still_serving(srv: ServerProcess) -> None:
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
    r = httpx.post(srv.url + CMPL, json={**G, "max_tokens": 8, "temperature": 0}, headers=srv.headers,
                   timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    state = srv.wait_idle()
    assert not state["engine_dead"] and state["num_free_blocks"] == state["num_total_blocks"], state


def test_legal_extremes_are_served_in_bounded_time(srv: ServerProcess, ledger) -> None:
    """Inputs at the limits that are valid: served (not refused), quickly, leaving nothing behind."""
    extremes = [
        {**G, "stop": ["x" * 4000 + str(i) for i in range(64)], "max_tokens": 16},
        {**G, "stop": ["y" * 200_000], "max_tokens": 16},
        {**G, "logit_bias": {str(i): -100.0 for i in range(VOCAB)}, "max_tokens": 8},
        {**G, "n": 128, "max_tokens": 2, "logprobs": 20},
        {**G, "prompt": [[7] * 8] * 16, "n": 8, "max_tokens": 2},
        {**G, "top_k": 2**31 - 1, "temperature": 0.8, "seed": 1, "max_tokens": 8},
        {**G, "prompt": [5] * (MAX_MODEL_LEN - 2), "max_tokens": 2},
        {**G, "prompt": "a", "max_tokens": 4, "junk": {"deep": [[[[[[[[1]]]]]]]]}},  # unknown fields are ignored
    ]
    for body in extremes:
        r, seconds = _send(srv, CMPL, body)
        assert r.status_code == 200, r.text[:300]
        assert seconds < 30, f"{seconds:.1f}s"
    ledger.add("hostile input", "legal extremes served", len(extremes))
    _still_serving(srv)


def test_min_tokens_beyond_the_context_is_refused(srv: ServerProcess) -> None:
    body = {**C, "min_tokens": 10**9}
    del body["max_completion_tokens"]  # max_tokens resolves to "the rest of the context"
    r, _ = _send(srv, CHAT, body)
    assert r.status_code == 400 and "min_tokens" in r.text, r.text[:200]
