"""``specserve serve``: flags and environment -> configs, clear refusals, and the real process:
start-up logs, SIGTERM drains in-flight streams (bounded by --shutdown-timeout) and exits 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from typing import Iterator

import httpx
import pytest

from specserve.engine.config import DEMO_MODEL, ConfigError
from specserve.server.cli import build_parser, engine_config, main, server_options
from tests.helpers.server_process import ServerProcess


def _args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_engine_flags_reach_the_config() -> None:
    cfg = engine_config(_args("--model", "/m", "--draft-model", "/d", "--num-speculative-tokens", "5",
                              "--rejection-sample-method", "strict", "--draft-sample-method", "greedy",
                              "--dtype", "float16", "--device", "cpu", "--block-size", "32",
                              "--num-kv-blocks", "100", "--kv-cache-memory", "2GiB", "--max-model-len", "77",
                              "--max-num-seqs", "3", "--max-num-batched-tokens", "99",
                              "--max-waiting-requests", "7", "--no-enable-prefix-caching", "--enforce-eager",
                              "--seed", "11", "--kernel-backend", "torch", "--load-format", "dummy",
                              "--no-gemv", "--compile-workers", "3"))
    assert (cfg.model, cfg.speculative.model, cfg.num_speculative_tokens) == ("/m", "/d", 5)
    assert cfg.speculative.rejection_sample_method == "strict"
    assert cfg.speculative.draft_sample_method == "greedy"
    assert (cfg.dtype, cfg.device, cfg.block_size, cfg.num_kv_blocks) == ("float16", "cpu", 32, 100)
    assert cfg.kv_cache_memory == 2 * 2**30 and cfg.max_model_len == 77
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_waiting_requests) == (3, 99, 7)
    assert not cfg.enable_prefix_caching and cfg.enforce_eager and cfg.seed == 11
    assert (cfg.kernel_backend, cfg.load_format, cfg.gemv) == ("torch", "dummy", False)
    assert cfg.compile_workers == 3 and engine_config(_args()).compile_workers is None


def test_speculative_defaults_and_vllm_json() -> None:
    assert engine_config(_args()).model == DEMO_MODEL
    assert engine_config(_args()).speculative.model == DEMO_MODEL  # the demo pair brings its draft
    assert engine_config(_args("--num-speculative-tokens", "0")).num_speculative_tokens == 0
    assert engine_config(_args("--model", "/m")).num_speculative_tokens == 0
    assert engine_config(_args("--model", "/m", "--draft-model", "/d")).num_speculative_tokens == 4
    spec = '{"method": "draft_model", "model": "/d", "num_speculative_tokens": 2}'
    cfg = engine_config(_args("--model", "/m", "--speculative-config", spec,
                              "--draft-sample-method", "greedy"))
    assert (cfg.speculative.model, cfg.num_speculative_tokens) == ("/d", 2)
    assert cfg.speculative.draft_sample_method == "greedy"


@pytest.mark.parametrize("argv, needle", [
    (["--model", "/m", "--num-speculative-tokens", "3"], "--draft-model"),
    (["--speculative-config", '{"model": "/d"}', "--draft-model", "/d"], "either"),
    (["--speculative-config", '{"method": "eagle", "model": "/d"}'], "eagle"),
    (["--kv-cache-memory", "lots"], "size"),
    (["--block-size", "3"], "--block-size"),
    (["--compile-workers", "-1"], "--compile-workers"),
])
def test_bad_flags_are_refused_clearly(argv, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        engine_config(_args(*argv))


def test_keys_from_flags_and_environment_never_printed() -> None:
    opts = server_options(_args("--api-key", "k1", "--api-key", "k2"), {"SPECSERVE_API_KEY": "k3, k1,,"})
    assert opts.api_keys == ("k1", "k2", "k3")
    assert "k1" not in repr(opts) and "k3" not in repr(opts)
    assert server_options(_args(), {}).api_keys == ()


def test_missing_model_exits_2_with_a_message(capsys, tmp_path) -> None:
    assert main(["serve", "--model", str(tmp_path / "nope"), "--device", "cpu"], environ={}) == 2
    err = capsys.readouterr().err
    assert "nope" in err and "specserve: error" in err


def _start(tiny_pair, *extra: str) -> ServerProcess:
    """The tiny pair served as "tiny" (k = 3, CPU, an API key) in a child process, not yet ready."""
    target, draft = tiny_pair
    return ServerProcess(["--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", "3",
                          "--device", "cpu", "--api-key", "sk-very-secret", "--served-model-name", "tiny", *extra])


def _sse_lines(r: httpx.Response) -> Iterator[str]:
    """SSE lines split on "\n" only (httpx's iter_lines also splits on U+2028, U+0085, ..., which
    the random tiny model's text may hold inside a JSON string)."""
    buffer = b""
    for data in r.iter_bytes():
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            yield line.decode("utf-8")


def _stream_tokens(url: str, body: dict, out: dict) -> None:
    """Count the streamed token ids and note whether [DONE] arrived (any transport error ends it)."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60,
                          headers={"Authorization": "Bearer sk-very-secret"}) as r:
            for line in _sse_lines(r):
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    out["error"] = chunk.get("error", out.get("error"))
                    out["tokens"] += sum(len(c.get("token_ids", [])) for c in chunk.get("choices", []))
                    out["first"].set()
    except httpx.HTTPError:
        pass
    finally:
        out["first"].set()


def _start_stream(url: str, body: dict) -> tuple[threading.Thread, dict]:
    """Stream ``body`` in a thread; returns once its first chunk has arrived."""
    out: dict = {"tokens": 0, "done": False, "first": threading.Event()}
    t = threading.Thread(target=_stream_tokens, args=(url, body, out))
    t.start()
    assert out["first"].wait(30)
    return t, out


def test_sigterm_drains_in_flight_streams_and_exits_0(tiny_pair) -> None:
    with _start(tiny_pair, "--shutdown-timeout", "30") as srv:
        text = srv.logs()
        assert "serving 'tiny'" in text
        assert "on cpu" in text and "KV cache" in text and "tokens" in text and srv.url in text
        assert "start-up objects frozen" in text   # engine/heap.py ran before serving
        body = {"prompt": ["def add", "class"], "n": 4, "max_tokens": 200, "ignore_eos": True, "stream": True,
                "return_token_ids": True}
        t, out = _start_stream(srv.url, body)
        srv.send(signal.SIGTERM)
        assert srv.wait(timeout=60) == 0
        t.join(10)
        assert out["done"] and out["tokens"] == 2 * 4 * 200  # drained: every token of every choice
        logs = srv.logs()
    assert "sk-very-secret" not in logs


def test_sigterm_drain_is_bounded_by_shutdown_timeout(tiny_pair) -> None:
    with _start(tiny_pair, "--shutdown-timeout", "0.3", "--max-model-len", "512") as srv:
        body = {"prompt": ["def add", "class", "import os", "for i"], "n": 16, "max_tokens": 480,
                "ignore_eos": True, "stream": True, "return_token_ids": True}
        t, out = _start_stream(srv.url, body)
        t0 = time.monotonic()
        srv.send(signal.SIGTERM)
        assert srv.wait(timeout=30) == 0
        assert time.monotonic() - t0 < 10
        t.join(10)
        assert out["tokens"] < 4 * 16 * 480  # cut short, not run to the end ...
        # ... and ended properly: an error event, then [DONE] (issue 16)
        assert out["done"] and out["error"]["code"] == "engine_unavailable", (out, srv.log_tail(3000))
