"""Session fixtures: one tiny target/draft pair and one live server shared by most server tests."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from tests.helpers.checkpoints import make_perturbed_copy
from tests.server.live import LiveServer

API_KEY = "sk-test-primary"
API_KEY_2 = "sk-test-secondary"
MODEL = "tiny"
MAX_MODEL_LEN = 256
K = 3


@pytest.fixture(scope="session")
def tiny_pair(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The shared tiny llama as target; a noisy copy of it as the draft.

    noise 0.01 gives ~52% greedy agreement and ~78% sampling acceptance: acceptance is neither 0
    nor 1, so per-position counters and acceptance lengths are informative.
    """
    target = tiny_checkpoint("llama")
    draft = make_perturbed_copy(target, tmp_path_factory.mktemp("server-draft") / "draft", noise=0.01, seed=1)
    return target, draft


def server_argv(tiny_pair: tuple[Path, Path], *extra: str) -> list[str]:
    target, draft = tiny_pair
    # fixed k: these tests check speculation's plumbing (drafts, acceptance, metrics); with the
    # tiny pair (draft as costly as the target) adaptive k rightly chooses not to draft
    return ["--model", str(target), "--draft-model", str(draft), "--num-speculative-tokens", str(K),
            "--speculative-k", "fixed", "--device", "cpu", "--max-model-len", str(MAX_MODEL_LEN), *extra]


@pytest.fixture(scope="session")
def server(tiny_pair: tuple[Path, Path]):
    argv = server_argv(tiny_pair, "--served-model-name", MODEL, "--api-key", API_KEY)
    with LiveServer(argv, environ={"SPECSERVE_API_KEY": f" {API_KEY_2} ,"}) as live:
        yield live


@pytest.fixture(scope="session")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="session")
def http(server: LiveServer):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                      timeout=60) as c:
        yield c
