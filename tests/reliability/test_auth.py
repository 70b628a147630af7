"""Auth: without the key every /v1 and /debug route is 401 (streaming and /v1/models included);
keys are compared in constant time; no key ever shows up in the logs or in any response.

The shared ``main_srv`` runs with one key on the command line and one in SPECSERVE_API_KEY, at log
level debug with the access log on: the most talkative configuration. The hostile-input tests use
the same server, so their traffic is in the logs that are searched here too.
"""

from __future__ import annotations

import secrets
import time

import httpx

from specserve.server.auth import APIKeyChecker
from tests.reliability.conftest import API_KEY, ENV_KEY
from tests.helpers.server_process import ServerProcess

BODIES = {
    "/v1/completions": {"model": "tiny", "prompt": "def add", "max_tokens": 2},
    "/v1/chat/completions": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}],
                             "max_completion_tokens": 2},
    "/debug/fault": {"message": "x"},
}
OPEN = ["/health", "/metrics", "/version", "/openapi.json", "/docs"]


def _guarded_routes(main_srv: ServerProcess) -> list[tuple[str, str]]:
    doc = httpx.get(main_srv.url + "/openapi.json", timeout=10).json()
    routes = [(method.upper(), path) for path, ops in doc["paths"].items() for method in ops
              if path.startswith(("/v1/", "/debug/"))]
    assert {("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
            ("GET", "/debug/state")} <= set(routes)
    return routes


BAD_HEADERS = {
    "no header": {},
    "bearer without a key": {"Authorization": "Bearer"},
    "wrong key": {"Authorization": "Bearer sk-wrong"},
    "key plus a suffix": {"Authorization": f"Bearer {API_KEY}x"},
    "key prefix": {"Authorization": f"Bearer {API_KEY[:-1]}"},
    "basic scheme": {"Authorization": f"Basic {API_KEY}"},
    "key without scheme": {"Authorization": API_KEY},
    "key in another header": {"X-API-Key": API_KEY},
}


def test_every_guarded_route_is_401_without_the_key(main_srv: ServerProcess, ledger) -> None:
    checked = 0
    for method, path in _guarded_routes(main_srv):
        for stream in ((False, True) if path in BODIES and path.startswith("/v1") else (False,)):
            body = {**BODIES[path], "stream": True} if stream else BODIES.get(path)
            for name, headers in BAD_HEADERS.items():
                r = httpx.request(method, main_srv.url + path, json=body, headers=headers, timeout=10)
                assert r.status_code == 401, (method, path, name, r.status_code, r.text[:200])
                assert r.headers["content-type"].startswith("application/json")  # not an SSE stream
                assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
                checked += 1
    for path in ("/v1/completions", "/v1/chat/completions"):  # an invalid body still meets auth first
        assert httpx.post(main_srv.url + path, json={}, timeout=10).status_code == 401
    for key in (API_KEY, ENV_KEY):
        ok = httpx.post(main_srv.url + "/v1/completions", json=BODIES["/v1/completions"],
                        headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert ok.status_code == 200
    for path in OPEN:
        assert httpx.get(main_srv.url + path, timeout=10).status_code == 200, path
    # the test-only fault hook is not there without --enable-test-hooks, key or not
    assert httpx.post(main_srv.url + "/debug/fault", json={"message": "x"}, headers=main_srv.headers).status_code == 404
    assert "/debug/fault" not in httpx.get(main_srv.url + "/openapi.json", timeout=10).json()["paths"]
    assert main_srv.state()["engine_dead"] is False
    ledger.add("auth", "unauthenticated requests tried", checked)
    ledger.add("auth", "all 401", True)


def test_key_comparison_takes_the_same_time_wherever_the_mismatch_is() -> None:
    """A 1 MiB key: a naive ``==`` returns after one byte for an early mismatch and after 1 MiB for
    a late one (~1000x apart); a constant-time compare reads the whole key either way. Bound: the
    best-of-15 timings differ by less than 2x."""
    key = secrets.token_hex(2**19)  # 1 MiB of text
    checker = APIKeyChecker([key])
    early = "Bearer " + ("0" if key[0] != "0" else "1") + key[1:]
    late = "Bearer " + key[:-1] + ("0" if key[-1] != "0" else "1")

    def best(header: str) -> float:
        times = []
        for _ in range(15):
            t0 = time.perf_counter()
            for _ in range(5):
                assert not checker.is_valid(header)
            times.append(time.perf_counter() - t0)
        return min(times)

    best(early)  # warm up
    t_early, t_late = best(early), best(late)
    assert 0.5 < t_early / t_late < 2.0, (t_early, t_late)
    assert checker.is_valid("Bearer " + key)


def test_keys_never_appear_in_logs_or_responses(main_srv: ServerProcess, ledger) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    seen: list[str] = []
    with httpx.Client(base_url=main_srv.url, timeout=30) as c:
        traffic = [
            c.post("/v1/completions", json={**BODIES["/v1/completions"], "stream": True}, headers=auth),
            c.post("/v1/completions", json={"model": "nope", "prompt": "a"}, headers=auth),       # 404
            c.post("/v1/completions", json={"prompt": "a", "n": 10**6}, headers=auth),           # 400
            c.post("/v1/completions", content=b"{not json", headers={**auth, "Content-Type": "application/json"}),
            c.post("/v1/completions", json=BODIES["/v1/completions"],
                   headers={"Authorization": f"Bearer {API_KEY}x"}),                              # 401
            c.get("/v1/models", headers={"Authorization": f"Bearer {ENV_KEY}"}),
            c.get("/debug/state", headers=auth),
            c.get("/metrics"), c.get("/openapi.json"), c.get("/health"),
        ]
        seen = [r.text for r in traffic]
    time.sleep(0.5)  # let the log lines land
    logs = main_srv.logs()
    ledger.add("auth", "log bytes searched for keys", len(logs))
    for key in (API_KEY, ENV_KEY):
        assert key not in logs
        assert not [t for t in seen if key in t]
    assert "POST /v1/completions" in logs  # the access log was on and was searched
