"""Issue 16's other cases, each against a real server process:

* a 413 that async clients (httpx.AsyncClient, AsyncOpenAI) actually receive;
* an incomplete body is answered 408 and its connection closed after --request-body-timeout;
* the API key from --api-key-file and $VLLM_API_KEY (never on the command line);
* --shutdown-timeout running out: a 503 JSON for non-streaming requests, an error event then
  [DONE] for streams, no traceback in the log, exit status 0;
* a KV cache that cannot hold one max_model_len request: refused at start-up with the largest
  max_model_len it holds, or (--auto-fit-max-model-len) lowered to it with a warning.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.reliability.clients import Outcome, run_request
from tests.reliability.conftest import API_KEY, BODY_LIMIT, K, serve_argv, start_server
from tests.helpers.server_process import ServerProcess

ATTEMPTS = 10
BODY_TIMEOUT = 1.0
SLOW_CLIENTS = 50


# ------------------------------------------------------------------------------ 413, async

async def _async_413(url: str) -> list[tuple[int, str]]:
    seen = []
    bodies = [{"model": "tiny", "prompt": "x" * (BODY_LIMIT + 1)},          # declared, just over
              {"model": "tiny", "prompt": "x" * (4 * BODY_LIMIT)}]         # declared, 4x
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {API_KEY}"},
                                 timeout=30) as c:
        for i in range(ATTEMPTS):
            try:
                r = await c.post("/v1/completions", json=bodies[i % 2])
                seen.append((r.status_code, r.json()["error"]["code"]))
            except httpx.TransportError as e:
                seen.append((0, type(e).__name__))

        async def chunked():
            yield b'{"prompt": "'
            for _ in range(8):
                yield b"x" * (BODY_LIMIT // 2)
            yield b'"}'

        try:
            r = await c.post("/v1/completions", content=chunked(), headers={"Content-Type": "application/json"})
            seen.append((r.status_code, r.json()["error"]["code"]))
        except httpx.TransportError as e:
            seen.append((0, type(e).__name__))
    oa = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=30)
    for _ in range(ATTEMPTS):
        try:
            await oa.completions.create(model="tiny", prompt="x" * (BODY_LIMIT + 1), max_tokens=2)
            seen.append((200, "accepted"))
        except openai.APIStatusError as e:
            seen.append((e.status_code, (e.body or {}).get("code") if isinstance(e.body, dict) else str(e.body)))
        except openai.APIConnectionError as e:
            seen.append((0, type(e).__name__))
    await oa.close()
    return seen


def test_async_clients_receive_the_413(main_srv: ServerProcess, ledger) -> None:
    seen = asyncio.run(_async_413(main_srv.url))
    ok = [s for s in seen if s == (413, "request_too_large")]
    ledger.add("hardening", "oversized bodies from async clients answered 413", f"{len(ok)}/{len(seen)}")
    assert len(ok) == len(seen) == 2 * ATTEMPTS + 1, seen


# ----------------------------------------------------------------------- incomplete bodies

def _incomplete(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ")
    return s


def _answer(s: socket.socket) -> bytes:
    data = b""
    while True:
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, socket.timeout):
            return data
        if not chunk:  # closed by the server
            return data + b"<closed>"
        data += chunk


@pytest.fixture(scope="module")
def short_srv(pair):
    with start_server(pair, "--request-body-timeout", str(BODY_TIMEOUT)) as s:
        yield s


def test_incomplete_bodies_get_408_and_are_closed(short_srv: ServerProcess, ledger) -> None:
    t0 = time.monotonic()
    socks = [_incomplete(short_srv.port) for _ in range(SLOW_CLIENTS)]
    answers = [_answer(s) for s in socks]
    took = time.monotonic() - t0
    for s in socks:
        s.close()
    closed = [a for a in answers if a.startswith(b"HTTP/1.1 408") and b"request_timeout" in a
              and a.endswith(b"<closed>")]
    ledger.add("hardening", "incomplete bodies answered 408 and closed", f"{len(closed)}/{SLOW_CLIENTS}")
    ledger.add("hardening", f"all {SLOW_CLIENTS} closed after s", round(took, 1))
    assert len(closed) == SLOW_CLIENTS, answers[:2]
    assert took < BODY_TIMEOUT + 5
    assert httpx.get(short_srv.url + "/health", timeout=5).status_code == 200
    assert short_srv.wait_idle()["num_unfinished_requests"] == 0


# ---------------------------------------------------------------------------- key sources

def test_keys_from_a_file_and_vllm_api_key_not_on_the_command_line(pair, tmp_path: Path, ledger) -> None:
    file_key, env_key = "sk-file-" + "9" * 24, "sk-vllm-" + "8" * 24
    key_file = tmp_path / "keys"
    key_file.write_text(f"\n{file_key}\n")
    key_file.chmod(0o600)
    argv = serve_argv(pair, "--api-key-file", str(key_file), api_key=None)
    with start_server(pair, argv=argv, environ={"VLLM_API_KEY": env_key}, api_key=None) as srv:
        cmdline = Path(f"/proc/{srv.proc.pid}/cmdline").read_bytes()
        codes = {name: httpx.get(srv.url + "/v1/models", headers=h, timeout=10).status_code
                 for name, h in (("file", {"Authorization": f"Bearer {file_key}"}),
                                 ("env", {"Authorization": f"Bearer {env_key}"}), ("none", {}))}
        malformed = httpx.post(srv.url + "/v1/completions", content=b"{not json",
                               headers={"Content-Type": "application/json"}, timeout=10)
    ledger.add("hardening", "keys from --api-key-file and VLLM_API_KEY", "accepted, not in argv")
    assert codes == {"file": 200, "env": 200, "none": 401}
    assert file_key.encode() not in cmdline and env_key.encode() not in cmdline
    assert malformed.status_code == 401 and malformed.json()["error"]["code"] == "invalid_api_key"


# -------------------------------------------------------------------------------- shutdown

def _long(i: int) -> tuple[str, dict]:
    stream = i % 2 == 0
    if i % 3 == 0:
        return "/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": f"c{i}"}],
                                        "max_completion_tokens": 200, "ignore_eos": True, "stream": stream}
    return "/v1/completions", {"model": "tiny", "prompt": f"x = {i}", "max_tokens": 200, "ignore_eos": True,
                               "stream": stream}


async def _cut_off(srv: ServerProcess, num: int) -> list[Outcome]:
    async with httpx.AsyncClient(base_url=srv.url, headers=srv.headers, timeout=60) as c:
        tasks = [asyncio.create_task(run_request(c, *_long(i))) for i in range(num)]
        deadline = time.monotonic() + 30
        while (await c.get("/debug/state")).json()["num_unfinished_requests"] < num:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        srv.send(signal.SIGTERM)
        return list(await asyncio.wait_for(asyncio.gather(*tasks), 30))


def test_shutdown_timeout_ends_leftovers_properly(pair, ledger) -> None:
    num = 8
    srv = start_server(pair, "--shutdown-timeout", "1", "--max-num-seqs", "1",
                       "--log-level", "info").wait_ready()
    try:
        t0 = time.monotonic()
        outcomes = asyncio.run(_cut_off(srv, num))
        code = srv.wait(timeout=30)
        took = time.monotonic() - t0
    finally:
        logs = srv.logs()
        srv.close()
    cut = [o for o in outcomes if o.error is not None]
    for i, o in enumerate(outcomes):
        if o.error is None:  # finished before the deadline
            assert o.status == 200
            continue
        assert o.error["code"] == "engine_unavailable" and "shutting down" in o.error["message"], o.error
        assert set(o.error) == {"message", "type", "param", "code"}
        if _long(i)[1]["stream"]:
            assert o.status == 200 and o.done_marker, "a stream must end with an error event then [DONE]"
        else:
            assert o.status == 503
    ledger.add("hardening", "requests cut off at --shutdown-timeout", f"{len(cut)}/{num} (503 or error event + [DONE])")
    assert len(cut) >= num // 2, [(o.status, o.error) for o in outcomes]
    assert "Traceback" not in logs and "Exception in ASGI" not in logs, logs[-3000:]
    assert code == 0 and took < 15


# ------------------------------------------------------------------------------- KV shortfall

def test_a_kv_cache_too_small_for_max_model_len(pair, ledger) -> None:
    small = ("--block-size", "16", "--num-kv-blocks", "5", "--max-model-len", "2048")
    srv = start_server(pair, *small)
    try:
        code = srv.wait(timeout=120)
        logs = srv.logs()
    finally:
        srv.close()
    largest = 5 * 16 - K
    assert code == 2, logs[-2000:]
    assert f"the largest max_model_len it can hold is {largest}" in logs, logs[-2000:]
    with start_server(pair, *small, "--auto-fit-max-model-len", "--log-level", "warning") as srv:
        model = httpx.get(srv.url + "/v1/models", headers=srv.headers, timeout=10).json()["data"][0]
        chat = httpx.post(srv.url + "/v1/chat/completions", headers=srv.headers, timeout=60,
                          json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
        warned = f"lowering max_model_len from 2048 to {largest}" in srv.logs()
    ledger.add("hardening", "KV shortfall", f"refused (exit 2, names {largest}); auto-fit -> {largest}")
    assert model["max_model_len"] == largest and warned
    assert chat.status_code == 200, chat.text  # no max_tokens: the rest of the (lowered) context
