"""What vLLM users rely on beyond the OpenAI core, through a real uvicorn and the openai client:
generation defaults from a generation_config.json (``--generation-config``), /tokenize and
/detokenize, /ping, ``usage.prompt_tokens_details.cached_tokens``, ``stop_reason`` always present,
several ``--served-model-name``s, the model id being ``--model`` as given, and the periodic stats
log line (``--log-stats-interval``, ``--disable-log-stats``)."""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

import httpx
import openai
import pytest

from specserve.engine import AsyncEngine
from specserve.engine.config import ConfigError
from specserve.engine.setup import resolve_generation_defaults
from specserve.engine.types import SpecDecodeStats, StepStats
from specserve.server.protocol import ChatCompletionRequest, CompletionRequest
from specserve.server.cli import build_parser, engine_config
from specserve.server.sampling import sampling_params
from specserve.server.stats_log import StatsLogger
from tests.server.conftest import API_KEY, MAX_MODEL_LEN, MODEL, server_argv
from tests.server.live import LiveServer

PROMPT = "def add(a, b):\n"
CHAT = [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "print squares"}]
DEFAULT_LEN = 5   # max_new_tokens of the generation config the defaults server gets
GEN_CONFIG = {"do_sample": True, "temperature": 0.7, "top_k": 1, "top_p": 0.9,
              "max_new_tokens": DEFAULT_LEN}


def _openai(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=60)


def _records(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


# ------------------------------------------------------------------------------ generation defaults

@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("gen-config")
    (folder / "generation_config.json").write_text(json.dumps(GEN_CONFIG))
    return folder


@pytest.fixture(scope="module")
def defaults_server(tiny_pair, gen_dir: Path):
    """No --served-model-name (the id is --model as given), defaults from a folder, stats every 0.3 s."""
    with LiveServer(server_argv(tiny_pair, "--generation-config", str(gen_dir),
                                "--log-stats-interval", "0.3")) as live:
        yield live


def test_resolve_generation_defaults(tiny_pair, gen_dir: Path, tmp_path: Path) -> None:
    want = {"temperature": 0.7, "top_k": 1, "top_p": 0.9, "max_tokens": DEFAULT_LEN}
    assert resolve_generation_defaults(str(gen_dir), str(tiny_pair[0])) == (
        want, str(gen_dir / "generation_config.json"))
    assert resolve_generation_defaults("vllm", str(gen_dir)) == ({}, None)
    assert resolve_generation_defaults("auto", str(gen_dir))[0] == want
    # the tiny checkpoints' own file names ids only: no defaults
    assert resolve_generation_defaults("auto", str(tiny_pair[0]))[0] == {}
    # do_sample false: the sampling knobs are not defaults, the length still is
    (tmp_path / "generation_config.json").write_text(json.dumps({**GEN_CONFIG, "do_sample": False}))
    assert resolve_generation_defaults(str(tmp_path), "/unused")[0] == {"max_tokens": DEFAULT_LEN}
    with pytest.raises(ConfigError, match="no generation_config.json"):
        resolve_generation_defaults(str(tmp_path / "missing"), "/unused")
    for bad in ({"temperature": "hot"}, {"top_p": 0}, {"max_new_tokens": 0}, {"top_k": 1.5}):
        (tmp_path / "generation_config.json").write_text(json.dumps(bad))
        with pytest.raises(ConfigError, match="generation_config.json"):
            resolve_generation_defaults(str(tmp_path), "/unused")


def test_request_fields_win_over_defaults() -> None:
    defaults = {"temperature": 0.7, "top_k": 1, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.2}
    p = sampling_params(CompletionRequest(prompt="x"), max_tokens=3, logprobs=None, defaults=defaults)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.7, 1, 0.9, 0.05, 1.2)
    # sent fields win, null means "the default"
    req = ChatCompletionRequest.model_validate({"messages": CHAT, "temperature": 0, "top_k": None,
                                                "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0})
    p = sampling_params(req, max_tokens=None, logprobs=None, defaults=defaults)
    assert (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty) == (0.0, 1, 1.0, 0.0, 1.0)
    # no defaults: the API's own
    p = sampling_params(CompletionRequest(prompt="x"), max_tokens=3, logprobs=None)
    assert (p.temperature, p.top_k, p.top_p) == (1.0, 0, 1.0)


def test_defaults_logged_at_start_up(tiny_pair, gen_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="specserve.engine"):
        for choice in (str(gen_dir), "vllm"):
            AsyncEngine(engine_config(build_parser().parse_args(
                ["serve", *server_argv(tiny_pair, "--generation-config", choice)])))
    lines = [m for m in _records(caplog, "specserve.engine") if m.startswith("generation defaults")]
    assert lines[0] == (f"generation defaults from {gen_dir / 'generation_config.json'}: temperature=0.7, "
                        f"top_p=0.9, top_k=1, max_tokens={DEFAULT_LEN} (a request's own fields win; "
                        "--generation-config vllm turns them off)")
    assert lines[1].startswith("generation defaults: none")


def test_default_length_for_chat_and_completions(defaults_server: LiveServer) -> None:
    client = _openai(defaults_server)
    chat = client.chat.completions.create(model=defaults_server.model, messages=CHAT,
                                          extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == DEFAULT_LEN and chat.choices[0].finish_reason == "length"
    cmpl = client.completions.create(model=defaults_server.model, prompt=PROMPT,
                                     extra_body={"ignore_eos": True})
    assert cmpl.usage.completion_tokens == DEFAULT_LEN
    own = client.completions.create(model=defaults_server.model, prompt=PROMPT, max_tokens=9,
                                    extra_body={"ignore_eos": True})
    assert own.usage.completion_tokens == 9   # the request's own max_tokens wins
    # the default length never overflows the context: a long prompt gets what is left, not a 400
    ids = [7] * (MAX_MODEL_LEN - 2)
    tight = client.completions.create(model=defaults_server.model, prompt=ids,
                                      extra_body={"ignore_eos": True})
    assert tight.usage.completion_tokens == 2 and tight.choices[0].finish_reason == "length"


def test_default_sampling_knobs_apply_unless_sent(defaults_server: LiveServer) -> None:
    """top_k = 1 from the generation config makes sampling greedy; a request's top_k = 0 wins."""
    client = _openai(defaults_server)
    kw = dict(model=defaults_server.model, prompt=PROMPT, max_tokens=12)
    greedy = client.completions.create(**kw, temperature=0, extra_body={"ignore_eos": True}).choices[0].text
    for seed in range(3):
        r = client.completions.create(**kw, seed=seed, extra_body={"ignore_eos": True})
        assert r.choices[0].text == greedy
        r = client.completions.create(**kw, seed=seed, extra_body={"ignore_eos": True, "top_k": None})
        assert r.choices[0].text == greedy    # null = the default
    texts = {client.completions.create(**kw, seed=seed, temperature=1.5, top_p=1.0,
                                       extra_body={"ignore_eos": True, "top_k": 0}).choices[0].text
             for seed in range(6)}
    assert texts - {greedy}, "sampling with the request's own top_k = 0 never left the greedy path"


# --------------------------------------------------------------------- names and the model listing

def test_model_id_is_the_path_as_given(defaults_server: LiveServer, tiny_pair) -> None:
    target = str(tiny_pair[0])
    assert defaults_server.model == target
    models = _openai(defaults_server).models.list().data
    assert [m.id for m in models] == [target]
    assert models[0].model_dump()["max_model_len"] == MAX_MODEL_LEN


@pytest.fixture(scope="module")
def plain_server(tiny_pair):
    """The target alone (no draft), two served names, no stats log."""
    argv = ["--model", str(tiny_pair[0]), "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN),
            "--served-model-name", "alpha", "beta", "--disable-log-stats"]
    with LiveServer(argv) as live:
        yield live


def test_several_served_model_names(plain_server: LiveServer) -> None:
    assert plain_server.app.state.stats_log is None
    client = _openai(plain_server)
    models = client.models.list().data
    assert [m.id for m in models] == ["alpha", "beta"]
    assert all(m.model_dump()["max_model_len"] == MAX_MODEL_LEN for m in models)
    for name in ("alpha", "beta"):
        r = client.completions.create(model=name, prompt=PROMPT, max_tokens=2)
        assert r.model == "alpha"    # the first name is the one reported
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gamma", prompt=PROMPT, max_tokens=2)
    tok = httpx.post(f"{plain_server.url}/tokenize", json={"model": "beta", "prompt": "x"}, timeout=30)
    assert tok.status_code == 200


# ------------------------------------------------------------------------- tokenize / detokenize

def test_tokenize_prompt_and_detokenize(server: LiveServer, http: httpx.Client) -> None:
    text = "def add(a, b):\n    return a + b"
    ids = list(server.engine.tokenizer(text)["input_ids"])
    r = http.post("/tokenize", json={"model": MODEL, "prompt": text})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": len(ids), "max_model_len": MAX_MODEL_LEN, "tokens": ids}
    assert http.post("/tokenize", json={"prompt": ""}).json()["count"] == 0
    r = http.post("/detokenize", json={"model": MODEL, "tokens": ids})
    assert r.status_code == 200 and r.json() == {"prompt": text}


def test_tokenize_chat_matches_the_chat_prompt(server: LiveServer, http: httpx.Client,
                                               client: openai.OpenAI) -> None:
    r = http.post("/tokenize", json={"model": MODEL, "messages": CHAT})
    assert r.status_code == 200, r.text
    body = r.json()
    chat = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=1)
    assert body["count"] == len(body["tokens"]) == chat.usage.prompt_tokens
    text = server.engine.tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert body["tokens"] == list(server.engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    bare = http.post("/tokenize", json={"messages": CHAT, "add_generation_prompt": False}).json()
    assert bare["count"] < body["count"] and body["tokens"][:bare["count"]] == bare["tokens"]


def test_tokenize_errors(server: LiveServer, http: httpx.Client) -> None:
    cases = [("/detokenize", {"tokens": [10**9]}, 400), ("/detokenize", {"tokens": ["a"]}, 400),
             ("/tokenize", {}, 400), ("/tokenize", {"prompt": 5}, 400),
             ("/tokenize", {"model": "nope", "prompt": "x"}, 404),
             ("/tokenize", {"messages": CHAT, "continue_final_message": True}, 400)]
    for path, body, status in cases:
        r = http.post(path, json=body)
        assert r.status_code == status, (path, body, r.text)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    for path in ("/tokenize", "/detokenize"):   # behind the API key, like /v1/*
        assert httpx.post(f"{server.url}{path}", json={"prompt": "x", "tokens": [1]}).status_code == 401


def test_ping(server: LiveServer) -> None:
    for method in ("GET", "POST"):   # open, like /health
        r = httpx.request(method, f"{server.url}/ping", timeout=10)
        assert r.status_code == 200 and r.json() == {"status": "ok"}


# ------------------------------------------------------------------------ usage and stop_reason

def test_cached_tokens_count_prefix_cache_hits(plain_server: LiveServer) -> None:
    """On the target alone: with a draft, blocks enter the prefix cache only once the draft's KV
    covers them too, which depends on whether (and how far) the draft ran."""
    client = _openai(plain_server)
    prompt = "class Point:\n    def __init__(self, x, y):\n" * 6 + "# cached-tokens test\n"
    kw = dict(model="alpha", prompt=prompt, max_tokens=4, temperature=0)
    first = client.completions.create(**kw)
    second = client.completions.create(**kw)
    n = second.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 16 == 0 and cached < n       # whole blocks; the last token is computed
    stream = client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    last = list(stream)[-1]
    assert last.usage.prompt_tokens_details.cached_tokens == cached
    chat = [client.chat.completions.create(model="beta", messages=CHAT, max_tokens=1) for _ in range(2)]
    assert chat[1].usage.prompt_tokens_details.cached_tokens > 0


def _stop_token(http: httpx.Client) -> tuple[str, int]:
    """A greedy completion's third token: a stop token id that certainly fires."""
    r = http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0,
                                           "ignore_eos": True, "return_token_ids": True}).json()
    return r["choices"][0]["text"], r["choices"][0]["token_ids"][2]


def test_stop_reason_is_always_present(http: httpx.Client) -> None:
    base = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    r = http.post("/v1/completions", json=base).json()
    assert r["choices"][0]["stop_reason"] is None and r["choices"][0]["finish_reason"] == "length"
    text, tok = _stop_token(http)
    r = http.post("/v1/completions", json={**base, "stop_token_ids": [tok]}).json()
    assert r["choices"][0]["stop_reason"] == tok and r["choices"][0]["finish_reason"] == "stop"
    stop = text.strip()[:2] or text[:1]
    r = http.post("/v1/completions", json={**base, "stop": [stop]}).json()
    assert r["choices"][0]["stop_reason"] == stop
    chat = http.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 3}).json()
    assert "stop_reason" in chat["choices"][0]
    for path, body in (("/v1/completions", base), ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3})):
        with http.stream("POST", path, json={**body, "stream": True}) as s:
            chunks = [json.loads(line[6:]) for line in s.iter_lines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
        choices = [c for chunk in chunks for c in chunk["choices"]]
        assert choices and all("stop_reason" in c for c in choices)


# ----------------------------------------------------------------------------------- stats log

class _FakeEngine:
    def __init__(self) -> None:
        self.state = {"num_free_blocks": 75, "num_total_blocks": 100, "num_unfinished_requests": 2}

    def debug_state(self) -> dict:
        return self.state


def test_stats_line_from_step_stats() -> None:
    engine = _FakeEngine()
    stats_log = StatsLogger(engine, interval=10)
    spec = SpecDecodeStats()
    for accepted in (3, 1, 0, 2):
        spec.record(3, accepted)
    stats_log.on_step(StepStats(num_running=2, num_waiting=1, num_prompt_tokens=200,
                                num_generation_tokens=40, num_prefix_cache_queries=64,
                                num_prefix_cache_hits=16, spec_decode=spec))
    stats_log.on_step(StepStats(num_running=2, num_waiting=0, num_generation_tokens=10))
    line = stats_log.line(now=stats_log._since + 10.0)
    assert line == ("prompt 20.0 tok/s, generation 5.0 tok/s; running 2, waiting 0; KV cache 25.0% used; "
                    "prefix cache hit rate 25.0%; spec decode: acceptance length 2.50, draft acceptance "
                    "50.0% (6 of 12), per position 0.750 0.500 0.250")
    engine.state = {"num_free_blocks": 100, "num_total_blocks": 100, "num_unfinished_requests": 0}
    idle = stats_log.line(now=stats_log._since + 10.0)   # once more after the work ended ...
    assert idle.startswith("prompt 0.0 tok/s, generation 0.0 tok/s; running 0, waiting 0; KV cache 0.0%")
    assert "spec decode" not in idle
    assert stats_log.line(now=stats_log._since + 10.0) is None   # ... then quiet while idle


def test_stats_log_lines_from_a_live_server(defaults_server: LiveServer,
                                            caplog: pytest.LogCaptureFixture) -> None:
    client = _openai(defaults_server)
    # other servers of this test process log their own stats lines (every 10 s while they had
    # work): only this server's thread counts
    thread = f"uvicorn-{defaults_server.port}"

    def own() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if r.name == "specserve.stats" and r.threadName == thread]

    with caplog.at_level(logging.INFO, logger="specserve.stats"):
        client.completions.create(model=defaults_server.model, prompt=PROMPT, max_tokens=40, temperature=0,
                                  extra_body={"ignore_eos": True})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                "spec decode" in m for m in own()):
            time.sleep(0.1)
        idle = "prompt 0.0 tok/s, generation 0.0 tok/s; running 0, waiting 0"
        deadline = time.monotonic() + 15   # the idle line follows (however loaded the CPU), then nothing
        while time.monotonic() < deadline and not any(
                m.startswith(idle) for m in own()[-1:]):
            time.sleep(0.1)
        lines = own()
        time.sleep(1.0)
        assert own() == lines
    busy = [m for m in lines if "spec decode" in m]
    assert busy, lines
    pattern = (r"prompt [\d.]+ tok/s, generation [\d.]+ tok/s; running \d+, waiting \d+; KV cache [\d.]+% used; "
               r"prefix cache hit rate [\d.]+%; spec decode: acceptance length ([\d.]+), draft acceptance "
               r"[\d.]+% \(\d+ of \d+\), per position ([\d. ]+)")
    m = re.fullmatch(pattern, busy[0])
    assert m, busy[0]
    per_pos = [float(x) for x in m.group(2).split()]
    assert 1.0 <= float(m.group(1)) <= 1 + len(per_pos) and len(per_pos) <= 3
    assert all(0 <= b <= a <= 1 for a, b in zip(per_pos, per_pos[1:]))
    assert lines[-1].startswith("prompt 0.0 tok/s, generation 0.0 tok/s; running 0, waiting 0")

