"""Every dashboard query returns data from a real Prometheus scraping a real `specserve serve`.

The test builds a tiny target/draft pair, starts `specserve serve` (k = 3, CPU) and Prometheus
(scrape every second, with deploy/prometheus/specserve-rules.yml loaded) on 127.0.0.1, drives 20
requests, then evaluates every dashboard expression, every template-variable query and the
recording rules. The acceptance panels must agree with the server's own per-request numbers: the
``usage.spec_decode`` blocks of the responses.

Why the comparison can be tight: the counters exist at 0 before the load, both numerator and
denominator are scraped at the same instants, and the rate window covers the whole run, so
Prometheus's extrapolation scales numerator and denominator alike and cancels in the ratio.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.deploy._tools import RULES, ROOT, concrete, dashboard, dashboard_queries, find_tool

pytestmark = [pytest.mark.needs_server, pytest.mark.timeout(180)]

K = 3
MODEL = "tiny-pair"
NUM_REQUESTS = 20
WINDOW = "10m"      # $__rate_interval stand-in: longer than the whole test, so it spans the run
REL_TOL = 1e-6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check, what: str, timeout: float, proc: subprocess.Popen | None = None,
               log: Path | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text()[-3000:] if log else ""
            pytest.fail(f"{what}: process exited with {proc.returncode}\n{tail}", pytrace=False)
        try:
            result = check()
            if result:
                return result
        except Exception:  # not up yet
            pass
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log else ""
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}\n{tail}", pytrace=False)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve_command() -> list[str]:
    script = Path(sys.executable).parent / "specserve"
    if script.is_file():
        return [str(script), "serve"]
    return [sys.executable, "-c", "import sys; from server.cli import main; sys.exit(main())", "serve"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    try:
        from tests.helpers.checkpoints import make_tiny_checkpoint
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"tests/helpers/checkpoints.py is needed to build the tiny pair: {e}")
    root = tmp_path_factory.mktemp("pair")
    target = make_tiny_checkpoint(root / "target", arch="llama", seed=0)
    draft = make_tiny_checkpoint(root / "draft", arch="llama", seed=1, num_hidden_layers=1)
    return target, draft


def run_server(checkpoints: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory,
               *extra_args: str) -> Iterator[str]:
    """`specserve serve` of the tiny pair on 127.0.0.1 (k = K, CPU) until the generator closes;
    yields its URL. Other live tests reuse it with their own flags (e.g. --metrics-prefix vllm)."""
    import httpx

    target, draft = checkpoints
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = serve_command() + [
        "--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", str(K),
        "--served-model-name", MODEL, "--device", "cpu", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "256", "--seed", "0", *extra_args]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.pop("SPECSERVE_API_KEY", None)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/health", timeout=2).status_code == 200,
                   f"`{' '.join(cmd)}` to answer /health (the server issue must be in place)",
                   timeout=90, proc=proc, log=log)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def server(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_server(checkpoints, tmp_path_factory)


def run_prometheus(server: str, tmp_path_factory: pytest.TempPathFactory,
                   rules: str | None = None) -> Iterator[str]:
    """A real Prometheus scraping ``server`` every second, with ``rules`` (a rules file's text)."""
    import httpx

    binary = find_tool("prometheus")
    work = tmp_path_factory.mktemp("prometheus")
    (work / "rules.yml").write_text(rules or "groups: []\n")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(work / "rules.yml")],
        "scrape_configs": [{"job_name": "specserve",
                            "static_configs": [{"targets": [server.removeprefix("http://")]}]}],
    }
    (work / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = work / "prometheus.log"
    with log.open("w") as out:
        proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"],
                                cwd=work, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=2).status_code == 200,
                   "Prometheus to be ready", timeout=30, proc=proc, log=log)
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def prometheus(server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from run_prometheus(server, tmp_path_factory, RULES.read_text())


def query(prom: str, expr: str) -> list[dict]:
    import httpx

    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}\n{body}"
    return body["data"]["result"]


def scalar(prom: str, expr: str) -> float:
    result = query(prom, expr)
    assert len(result) == 1, f"{expr}: expected one series, got {result}"
    return float(result[0]["value"][1])


def one_request(url: str, i: int) -> dict:
    import httpx

    if i % 2:
        path, body = "/v1/chat/completions", {
            "messages": [{"role": "user", "content": f"Write a loop number {i}"}],
            "max_completion_tokens": 12 + i}
    else:
        path, body = "/v1/completions", {"prompt": f"def f{i}(x):\n    return", "max_tokens": 12 + i}
    body.update(model=MODEL, temperature=0.8, seed=i, ignore_eos=True)
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def load(server: str, prometheus: str) -> list[dict]:
    """Scraped zeros first, then 20 requests (4 at a time), then scrapes of the final counters."""
    wait_until(lambda: query(prometheus, 'count_over_time(up{job="specserve"}[1m]) >= 3'),
               "three scrapes of the idle server", timeout=30)
    assert scalar(prometheus, "sum(specserve:spec_decode_num_drafts_total)") == 0
    with cf.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda i: one_request(server, i), range(NUM_REQUESTS)))
    usages = [r["usage"]["spec_decode"] for r in responses]
    total = sum(u["num_drafts"] for u in usages)
    assert total > 0, "the load produced no drafts"
    wait_until(lambda: scalar(prometheus, "sum(specserve:spec_decode_num_drafts_total)") == total,
               "Prometheus to scrape the final counters", timeout=15)
    time.sleep(2.5)  # a couple more scrapes and rule evaluations at the final values
    return usages


def panel_value(prom: str, title: str, legend_suffix: str = "") -> list[dict]:
    (p,) = [p for p in dashboard()["panels"] if p["title"] == title]
    (t,) = [t for t in p["targets"] if t["legendFormat"].endswith(legend_suffix)][:1] or [None]
    assert t is not None, f"{title}: no target whose legend ends with {legend_suffix!r}"
    return query(prom, concrete(t["expr"], WINDOW))


def test_every_dashboard_query_returns_data(prometheus: str, load: list[dict]) -> None:
    empty = []
    for title, ref, expr in dashboard_queries():
        result = query(prometheus, concrete(expr, WINDOW))
        if not result:
            empty.append(f"{title} [{ref}]: {concrete(expr, WINDOW)}")
        for series in result:
            assert series["metric"].get("model_name", MODEL) == MODEL, (title, series["metric"])
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_template_variable_queries_find_the_server(prometheus: str, server: str, load: list[dict]) -> None:
    import httpx

    for var in dashboard()["templating"]["list"][1:]:
        q = var["query"]["query"]                      # label_values(<selector>, <label>)
        selector, label = q[len("label_values("):-1].rsplit(", ", 1)
        r = httpx.get(f"{prometheus}/api/v1/series", params={"match[]": concrete(selector)}, timeout=10)
        values = {s[label] for s in r.json()["data"]}
        assert values == {MODEL if label == "model_name" else server.removeprefix("http://")}, (q, values)


def test_acceptance_panels_agree_with_the_responses(prometheus: str, load: list[dict]) -> None:
    drafts = sum(u["num_drafts"] for u in load)
    accepted = sum(u["num_accepted_tokens"] for u in load)
    draft_tokens = sum(u["num_draft_tokens"] for u in load)
    assert drafts <= draft_tokens <= K * drafts  # fewer than k near max_tokens
    expected_length = 1 + accepted / drafts

    (stat,) = panel_value(prometheus, "Mean acceptance length")
    assert float(stat["value"][1]) == pytest.approx(expected_length, rel=REL_TOL)
    (aggregate,) = panel_value(prometheus, "Acceptance length: aggregate and per request", "aggregate")
    assert float(aggregate["value"][1]) == pytest.approx(expected_length, rel=REL_TOL)
    (rate,) = panel_value(prometheus, "Acceptance rate")
    assert float(rate["value"][1]) == pytest.approx(accepted / draft_tokens, rel=REL_TOL)

    per_request = [u["acceptance_length"] for u in load]
    assert all(1.0 <= x <= K + 1 for x in per_request)
    (mean,) = panel_value(prometheus, "Acceptance length: aggregate and per request", "per-request mean")
    assert float(mean["value"][1]) == pytest.approx(sum(per_request) / len(per_request), rel=REL_TOL)

    positions = panel_value(prometheus, "Acceptance rate per draft position")
    got = {int(s["metric"]["position"]): float(s["value"][1]) for s in positions}
    assert sorted(got) == list(range(K))
    for i in range(K):
        expected = sum(u["accepted_per_position"][i] for u in load) / drafts
        assert got[i] == pytest.approx(expected, rel=REL_TOL, abs=1e-12), i
    assert all(got[i] >= got[i + 1] for i in range(K - 1)), "per-position acceptance never rises"


def test_recording_rules_agree_on_real_metrics(prometheus: str, load: list[dict]) -> None:
    drafts = sum(u["num_drafts"] for u in load)
    accepted = sum(u["num_accepted_tokens"] for u in load)
    wait_until(lambda: query(prometheus, "model_name:specserve_spec_decode_acceptance_length:rate5m"),
               "the recording rules to evaluate", timeout=10)
    value = scalar(prometheus, f'model_name:specserve_spec_decode_acceptance_length:rate5m{{model_name="{MODEL}"}}')
    assert value == pytest.approx(1 + accepted / drafts, rel=REL_TOL)
    positions = query(prometheus, "model_name_position:specserve_spec_decode_acceptance_rate_per_position:rate5m")
    assert len(positions) == K
