"""Measure the demo pair's acceptance per temperature through a real ``specserve serve``.

For each verification mode a server is started on 127.0.0.1 (``python -m server.cli serve``, the
demo pair, k=4), fixed seeded requests are sent at each temperature, and the per-request
``usage.spec_decode`` counters are summed. Reported per temperature:

- alpha_hat = drafts whose first token was accepted / drafts (the per-token acceptance rate);
- mean acceptance length = 1 + accepted / drafts (tokens per target step, bonus included).

Modes: ``probabilistic`` (accept with min(1, p/q), the draft's probabilities kept: the default)
and ``strict`` (accept only when the draft equals the target's own sample, i.e. no draft
probabilities: acceptance sum p*q, like the "draft prob taken as 1" bug). Results go to a JSON file
(``--out``, default engine/demo/server_table.json) that ``demo_card.py`` renders into the card.

    python scripts/demo_server_table.py --requests 6 --max-tokens 96
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
TEMPERATURES = (0.3, 0.5, 0.7, 1.0, 1.3, 1.5, 2.0)
PROMPTS = ("import os\n\n\ndef main(", "class Config", "def fibonacci(n):", "import numpy as np\n\n\ndef",
           "    def __init__(self", "from typing import", "def test_", "    return")


def start_server(port: int, extra: list[str]) -> subprocess.Popen:
    """``specserve serve`` with no model arguments (the demo pair) on 127.0.0.1:port."""
    cmd = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--no-access-log", *extra]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_server(proc)
    raise RuntimeError("server did not become healthy in 180 s")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def one_request(port: int, prompt: str, temperature: float, seed: int, max_tokens: int) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
            "seed": seed, "ignore_eos": True}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    return r.json()["usage"]["spec_decode"]


def measure(port: int, requests: int, max_tokens: int, temps=TEMPERATURES) -> dict:
    """Per temperature: summed drafts / accepted / first-position accepts over seeded requests."""
    out = {}
    for t in temps:
        jobs = [(PROMPTS[i % len(PROMPTS)], t, 1000 + i) for i in range(requests)]
        with ThreadPoolExecutor(max_workers=requests) as pool:
            stats = list(pool.map(lambda j: one_request(port, j[0], j[1], j[2], max_tokens), jobs))
        drafts = sum(s["num_drafts"] for s in stats)
        accepted = sum(s["num_accepted_tokens"] for s in stats)
        first = sum((s["accepted_per_position"] or [0])[0] for s in stats)
        out[f"{t:g}"] = {"drafts": drafts, "accepted": accepted, "first_accepted": first,
                         "alpha_hat": first / max(drafts, 1),
                         "acceptance_length": 1 + accepted / max(drafts, 1)}
        print(f"T={t:g}: {out[f'{t:g}']}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=18437)
    ap.add_argument("--requests", type=int, default=6, help="concurrent seeded requests per temperature")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=REPO / "engine" / "demo" / "server_table.json")
    args = ap.parse_args()
    result = {"command": "python scripts/demo_server_table.py " + " ".join(sys.argv[1:]),
              "measured": time.strftime("%Y-%m-%d"), "device": "cpu (the server's default here)",
              "requests_per_temperature": args.requests, "max_tokens": args.max_tokens,
              "num_speculative_tokens": 4, "prompts": list(PROMPTS), "modes": {}}
    for mode in ("probabilistic", "strict"):
        print(f"--- {mode}", flush=True)
        proc = start_server(args.port, ["--rejection-sample-method", mode])
        try:
            result["modes"][mode] = measure(args.port, args.requests, args.max_tokens)
        finally:
            stop_server(proc)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
