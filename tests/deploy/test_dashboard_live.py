"""Every dashboard query returns data from a real Prometheus scraping a real `specserve serve`.

The test builds a tiny target/draft pair (the draft is the target's first layer, which predicts it
exactly: see tests/helpers/checkpoints.make_layer_prefix_pair), starts `specserve serve` (k = 3,
CPU, adaptive k) and
Prometheus (scrape every second, with deploy/prometheus/specserve-rules.yml loaded) on 127.0.0.1,
drives 20 requests, then evaluates every dashboard expression, every template-variable query and the
recording rules. The acceptance panels must agree with the server's own per-request numbers: the
``usage.spec_decode`` blocks of the responses; the prefix-cache, chosen-k and draft/target-time
panels with the server's own /metrics counters.

The requests are unseeded: adaptive k pins seeded requests at temperature > 0 to k = 0 (plain
decoding), which would leave the speculation panels empty. The completions share a three-block
prompt prefix, so the prefix cache has hits.

Why the comparison can be tight: the counters exist at 0 before the load, both numerator and
denominator are scraped at the same instants, and the rate window covers the whole run, so
Prometheus's extrapolation scales numerator and denominator alike and cancels in the ratio.
"""

from __future__ import annotations

import concurrent.futures as cf
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.deploy._tools import RULES, concrete, dashboard, dashboard_queries, find_tool
from tests.helpers.server_process import SERVE, ServerProcess, free_port

pytestmark = [pytest.mark.needs_server, pytest.mark.timeout(180)]

K = 3
MODEL = "tiny-pair"
NUM_REQUESTS = 20
WINDOW = "10m"      # $__rate_interval stand-in: longer than the whole test, so it spans the run
REL_TOL = 1e-6
SHARED_PREFIX = "def shared_helper(values):\n    total = 0\n    for v in values:\n        total += v\n"


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
    """The installed ``specserve`` script's ``serve`` (what the image runs), else the module."""
    script = Path(sys.executable).parent / "specserve"
    if script.is_file():
        return [str(script), "serve"]
    return list(SERVE)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    try:
        from tests.helpers.checkpoints import make_layer_prefix_pair
    except ImportError as e:  # pragma: no cover
        pytest.fail(f"tests/helpers/checkpoints.py is needed to build the tiny pair: {e}")
    # a draft that predicts the target at a sixth of its layers: adaptive k drafts on a loaded
    # machine too (with a random pair it stayed at k = 0 in a CI run beside other jobs)
    return make_layer_prefix_pair(tmp_path_factory.mktemp("pair"), num_layers=6, draft_layers=1)


def run_server(checkpoints: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory,
               *extra_args: str) -> Iterator[str]:
    """`specserve serve` of the tiny pair on 127.0.0.1 (k = K, CPU) until the generator closes;
    yields its URL. Other live tests reuse it with their own flags (e.g. --metrics-prefix vllm)."""
    target, draft = checkpoints
    log = tmp_path_factory.mktemp("server") / "server.log"
    argv = ["--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", str(K),
            "--served-model-name", MODEL, "--device", "cpu", "--max-model-len", "256", "--seed", "0",
            *extra_args]
    with ServerProcess(argv, {"TRANSFORMERS_OFFLINE": "1"}, command=serve_command(), log_path=log,
                       drop_env=("SPECSERVE_API_KEY",)) as srv:
        yield srv.url


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
        path, body = "/v1/completions", {"prompt": f"{SHARED_PREFIX}def f{i}(x):\n    return",
                                         "max_tokens": 12 + i}
    body.update(model=MODEL, temperature=0.8, ignore_eos=True)  # no seed: see the module docstring
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

    variables = [v for v in dashboard()["templating"]["list"] if v["type"] == "query"]
    assert [v["name"] for v in variables] == ["model_name", "instance"]
    for var in variables:
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

    per_request = [u["acceptance_length"] for u in load if u["acceptance_length"] is not None]
    assert per_request
    assert all(1.0 <= x <= K + 1 for x in per_request)
    (mean,) = panel_value(prometheus, "Acceptance length: aggregate and per request", "per-request mean")
    assert float(mean["value"][1]) == pytest.approx(sum(per_request) / len(per_request), rel=REL_TOL)

    positions = panel_value(prometheus, "Acceptance rate per draft position")
    got = {int(s["metric"]["position"]): float(s["value"][1]) for s in positions}
    assert sorted(got) == list(range(K))
    for i in range(K):
        # a request whose steps all drafted fewer than K tokens reports a shorter list
        expected = sum(u["accepted_per_position"][i] for u in load if i < len(u["accepted_per_position"])) / drafts
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


def server_counter(server: str, name: str) -> float:
    """One sample of the server's own /metrics (the default prefix)."""
    import httpx

    text = httpx.get(f"{server}/metrics", timeout=10).text
    (line,) = [x for x in text.splitlines() if x.startswith(f"specserve:{name}{{")]
    return float(line.rsplit(" ", 1)[1])


def test_new_panels_agree_with_the_server(prometheus: str, server: str, load: list[dict]) -> None:
    """Prefix-cache hit rate, chosen k, draft/target time and the speed-up gauges, against /metrics."""
    hits, queries = server_counter(server, "prefix_cache_hits_total"), server_counter(server, "prefix_cache_queries_total")
    assert 0 < hits < queries, "the shared prompt prefix should hit the prefix cache"
    (hit_rate,) = panel_value(prometheus, "Prefix-cache hit rate")
    assert float(hit_rate["value"][1]) == pytest.approx(hits / queries, rel=REL_TOL)

    k_sum, k_count = server_counter(server, "spec_decode_chosen_k_sum"), server_counter(server, "spec_decode_chosen_k_count")
    assert k_count > 0 and 0 < k_sum <= K * k_count, "adaptive k chose drafts for some steps"
    (mean_k,) = panel_value(prometheus, "Chosen k over time", "mean k")
    assert float(mean_k["value"][1]) == pytest.approx(k_sum / k_count, rel=REL_TOL)
    (zero_share,) = panel_value(prometheus, "Chosen k over time", "share at k = 0")
    assert 0 <= float(zero_share["value"][1]) < 1
    cells = panel_value(prometheus, "Chosen k distribution")
    assert {s["metric"]["le"] for s in cells} >= {"0.0", f"{K}.0", "+Inf"}

    for phase in ("draft", "target"):
        name = f"spec_decode_{phase}_time_per_step_seconds"
        (series,) = panel_value(prometheus, "Draft vs target time per step", f"{phase} mean")
        expected = server_counter(server, f"{name}_sum") / server_counter(server, f"{name}_count")
        assert float(series["value"][1]) == pytest.approx(expected, rel=REL_TOL) and expected > 0
    (share,) = panel_value(prometheus, "Draft share of step time")
    assert 0 < float(share["value"][1]) < 1

    for which in ("predicted", "measured"):
        (dial,) = panel_value(prometheus, "Predicted vs measured speed-up", which)
        assert float(dial["value"][1]) == pytest.approx(server_counter(server, f"spec_decode_{which}_speedup"))
        assert float(dial["value"][1]) > 0

    for title in ("Time to first token heatmap", "Inter-token latency heatmap", "End-to-end latency heatmap"):
        cells = panel_value(prometheus, title)
        assert "+Inf" in {s["metric"]["le"] for s in cells} and any(float(s["value"][1]) > 0 for s in cells), title
