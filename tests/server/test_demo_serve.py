"""``specserve serve`` with no model arguments serves the embedded demo pair (target + draft, k = 4).

A real ``python -m specserve.server.cli serve --device cpu`` subprocess (no other flag but its
address), talked to over loopback with httpx. It checks what a first-time user sees: the model is listed as "demo",
completions of Python prompts look like Python, and speculative decoding actually pays off
(mean acceptance length from /metrics well above 1).
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.helpers.server_process import ServerProcess
from tests.server.live import metric, scrape

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 45.0
# Greedy completions of function headers, cut at the first pair of blank lines (the end of a
# top-level definition): with the demo weights they are short bodies such as "\n    return ...".
FUNCTION_PROMPTS = ("def fibonacci(n):", "def add(a, b):", "def is_prime(n):")
SAMPLED_PROMPTS = (("import os\n\n\ndef main(", 11), ("class Config", 12), ("def read_json(path):", 13))
MIN_ACCEPTANCE_LENGTH = 1.5  # the pair measures ~2-3 at T = 0.7 (docs/acceptance.md); 1.0 = no gain


@contextlib.contextmanager
def _demo_server(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> Iterator[str]:
    """``specserve serve --device cpu FLAGS`` in a subprocess; its base URL once /health answers
    (its log is shown if it fails to start)."""
    log_path = tmp_path_factory.mktemp("demo-serve") / "server.log"
    # one torch thread: far faster than two on a small CPU shared with other work (MODEL_CARD.md)
    with ServerProcess(["--device", "cpu", *flags], environ={"OMP_NUM_THREADS": "1"},
                       log_path=log_path, start_timeout=START_TIMEOUT_S) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    # fixed k: the tests measure the pair's acceptance, which needs drafts every step (adaptive
    # k pins seeded sampling to k = 0 and may choose 0 on a CPU shared with other work)
    with _demo_server(tmp_path_factory, "--speculative-k", "fixed") as url:
        yield url


def test_the_readme_command_serves_with_adaptive_k(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``specserve serve`` exactly as the README runs it (no flags but the CPU device): adaptive k
    calibrated at start-up, and a completion served."""
    with _demo_server(tmp_path_factory) as url:
        out = httpx.post(f"{url}/v1/completions", json={"model": "demo", "prompt": "def add(a, b):",
                                                         "max_tokens": 24, "temperature": 0}, timeout=60)
        assert out.status_code == 200, out.text
        assert out.json()["usage"]["completion_tokens"] == 24
        spec = httpx.get(f"{url}/debug/state", timeout=10).json()["speculation"]
        assert spec["mode"] == "adaptive" and spec["k_max"] == 4
        assert spec["cost"]["calibration"]["target_seconds"], spec


def _complete(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/completions", json={"model": "demo", **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_models_lists_demo_with_its_draft(demo_url: str) -> None:
    data = httpx.get(f"{demo_url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in data] == ["demo"]
    spec = data[0]["speculative"]
    assert spec["num_speculative_tokens"] == 4
    assert Path(spec["draft_model"]).parts[-2:] == ("demo", "draft")
    assert (spec["rejection_sample_method"], spec["draft_sample_method"]) == ("probabilistic", "sample")


def test_greedy_function_completions_are_python(demo_url: str) -> None:
    """Looks like Python = the prompt plus the greedy completion, stopped at the first blank-line
    pair, parses with ``ast.parse`` into one function whose body is indented below the header."""
    for prompt in FUNCTION_PROMPTS:
        out = _complete(demo_url, prompt=prompt, max_tokens=64, temperature=0, stop=["\n\n\n"])
        choice = out["choices"][0]
        text = choice["text"]
        assert choice["finish_reason"] == "stop", (prompt, text)
        assert text.startswith("\n    ") and text.strip(), (prompt, text)
        tree = ast.parse(prompt + text)  # raises SyntaxError if it is not Python
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef), (prompt, text)
        assert out["usage"]["spec_decode"]["num_drafts"] >= 1


def test_sampled_completions_look_like_python_and_drafts_pay_off(demo_url: str) -> None:
    """Seeded T = 0.7 completions: printable ASCII, at least 90% of non-blank lines indented by a
    multiple of 4 spaces; the mean acceptance length from the /metrics deltas (1 + accepted /
    drafts) is above 1.5 and equals the same ratio over the responses' usage blocks."""
    before = scrape(demo_url)

    def one(job: tuple[str, int]) -> dict:
        return _complete(demo_url, prompt=job[0], seed=job[1], max_tokens=64, temperature=0.7,
                         ignore_eos=True)

    with ThreadPoolExecutor(max_workers=len(SAMPLED_PROMPTS)) as pool:
        outs = list(pool.map(one, SAMPLED_PROMPTS))
    after = scrape(demo_url)
    for (prompt, _), out in zip(SAMPLED_PROMPTS, outs):
        text = out["choices"][0]["text"]
        assert out["usage"]["completion_tokens"] == 64
        assert all(c == "\n" or 32 <= ord(c) < 127 for c in text), (prompt, text)
        lines = [ln for ln in (prompt + text).split("\n") if ln.strip()]
        indents = [len(ln) - len(ln.lstrip(" ")) for ln in lines]
        assert sum(i % 4 == 0 for i in indents) >= 0.9 * len(lines), (prompt, text)

    name = "specserve:spec_decode_num_{}_total"
    drafts = metric(after, name.format("drafts")) - metric(before, name.format("drafts"))
    accepted = (metric(after, name.format("accepted_tokens"))
                - metric(before, name.format("accepted_tokens")))
    usage = [o["usage"]["spec_decode"] for o in outs]
    assert drafts == sum(u["num_drafts"] for u in usage) > 0
    assert accepted == sum(u["num_accepted_tokens"] for u in usage)
    length = 1 + accepted / drafts
    assert MIN_ACCEPTANCE_LENGTH < length <= 4 + 1, length


def _readme_chat_body() -> dict:
    """The JSON body of the README's chat example (the curl to /v1/chat/completions)."""
    readme = (REPO / "README.md").read_text()
    match = re.search(r"curl -s localhost:8000/v1/chat/completions .*?-d '(\{.*?\})'", readme, re.S)
    assert match, "the README has no chat example"
    return json.loads(match.group(1))


def test_readme_chat_example_ends_within_the_default_length(demo_url: str) -> None:
    """The README's chat example sends no max_tokens: the demo's generation_config.json
    (max_new_tokens) bounds it, so it finishes by itself in seconds, not at the context's end."""
    body = _readme_chat_body()
    assert not {"max_tokens", "max_completion_tokens"} & set(body)
    default_len = json.loads((REPO / "engine/demo/target/generation_config.json").read_text())["max_new_tokens"]
    start = time.monotonic()
    r = httpx.post(f"{demo_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["finish_reason"] in ("stop", "length")
    assert 0 < out["usage"]["completion_tokens"] <= default_len
    assert time.monotonic() - start < 120
