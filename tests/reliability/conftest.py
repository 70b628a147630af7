"""Reliability fixtures: a tiny target/draft pair, real server processes, and the run's ledger.

Every test records what it tried (requests sent, clients dropped, bad inputs, faults) in the
ledger; at the end of the session the counts are printed as the table of docs/reliability.md and
written to ``build/reliability/last_run.md`` (and ``.json``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Sequence

import pytest

from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint
from tests.helpers.server_process import REPO, ServerProcess

API_KEY = "sk-reliability-0123456789abcdef"
ENV_KEY = "sk-env-" + "7f3a9c" * 6       # a second key, given through SPECSERVE_API_KEY
BODY_LIMIT = 512 * 1024
MAX_MODEL_LEN = 256
K = 3
MAX_RUNNING = 4                         # the queue server: running sequences ...
MAX_WAITING = 8                         # ... and waiting requests


@pytest.fixture(scope="session")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft): a tiny random llama and a noisy copy that agrees with it only partly."""
    root = tmp_path_factory.mktemp("reliability-ckpt")
    target = make_tiny_checkpoint(root / "target", arch="llama", seed=0)
    draft = make_perturbed_copy(target, root / "draft", noise=0.004, seed=1)
    return target, draft


@pytest.fixture(scope="session")
def eos_id(pair: tuple[Path, Path]) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(pair[0])).eos_token_id


def serve_argv(pair: tuple[Path, Path], *extra: str, api_key: str | None = API_KEY) -> list[str]:
    """``specserve serve`` flags for the pair: speculative decoding with k=3 on CPU (fixed k: these
    tests need drafts held while they disconnect, preempt and fail; with the tiny pair, whose draft
    costs as much as its target, adaptive k would rightly draft nothing)."""
    target, draft = pair
    argv = ["--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", str(K),
            "--speculative-k", "fixed", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN), "--served-model-name", "tiny",
            "--log-level", "warning", "--no-access-log", *extra]
    if api_key:
        argv += ["--api-key", api_key]
    return argv


def start_server(pair: tuple[Path, Path], *extra: str, api_key: str | None = API_KEY,
                 argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(argv if argv is not None else serve_argv(pair, *extra, api_key=api_key),
                         environ=environ, api_key=api_key)


@pytest.fixture(scope="session")
def main_srv(pair: tuple[Path, Path]) -> Iterator[ServerProcess]:
    """The talkative server (debug logs, access log, a key from the CLI and one from the
    environment, a 512 KiB body limit) that hostile input and auth tests share."""
    argv = serve_argv(pair, "--max-request-body-bytes", str(BODY_LIMIT))
    argv[argv.index("--log-level") + 1] = "debug"
    argv.remove("--no-access-log")
    with start_server(pair, argv=argv, environ={"SPECSERVE_API_KEY": ENV_KEY}) as s:
        yield s


@pytest.fixture(scope="session")
def queue_srv(pair: tuple[Path, Path]) -> Iterator[ServerProcess]:
    """A server with MAX_RUNNING running and MAX_WAITING waiting slots (overload tests)."""
    with start_server(pair, "--max-num-seqs", str(MAX_RUNNING), "--max-waiting-requests",
                      str(MAX_WAITING)) as s:
        yield s


# ---------------------------------------------------------------------------------- the ledger

class Ledger:
    """Counts per area, kept across the session: ``ledger.add("load", "requests", 300)``."""

    AREAS = ("load", "disconnects", "hostile input", "stalls", "hardening", "fuzz", "overload",
             "engine faults", "auth", "shutdown")

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, Any]] = {}

    def add(self, area: str, key: str, value: Any) -> None:
        counts = self.rows.setdefault(area, {})
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(counts.get(key), (int, float)):
            counts[key] += value
        else:
            counts[key] = value

    def markdown(self) -> str:
        lines = ["| area | what the last run did (counts) |", "|---|---|"]
        for area in sorted(self.rows, key=lambda a: self.AREAS.index(a) if a in self.AREAS else 99):
            cells = ", ".join(f"{k}: {_fmt(v)}" for k, v in self.rows[area].items())
            lines.append(f"| {area} | {cells} |")
        return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


_LEDGER = Ledger()


@pytest.fixture(scope="session")
def ledger() -> Iterator[Ledger]:
    yield _LEDGER
    if _LEDGER.rows:
        out = REPO / "build" / "reliability"
        out.mkdir(parents=True, exist_ok=True)
        (out / "last_run.md").write_text(_LEDGER.markdown())
        (out / "last_run.json").write_text(json.dumps(_LEDGER.rows, indent=2, sort_keys=True))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _LEDGER.rows:
        terminalreporter.write_sep("-", "reliability ledger (build/reliability/last_run.md)")
        terminalreporter.write(_LEDGER.markdown())
