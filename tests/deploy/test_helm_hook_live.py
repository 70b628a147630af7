"""The helm test hook's script, exactly as the chart renders it, run against a real `specserve serve`.

A cluster would run the rendered Pod's command with the Pod's environment. Here the same command runs
in a subprocess with that environment, the Service URL swapped for the loopback server of
test_dashboard_live.py (its fixtures are reused, not copied).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.deploy._tools import by_kind
from tests.deploy.test_dashboard_live import MODEL, checkpoints, server  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.needs_server, pytest.mark.timeout(180)]


def rendered_hook(helm, *args: str) -> dict:
    docs = helm.template("--set", f"model.servedModelName={MODEL}", *args)
    (pod,) = [d for d in by_kind(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    (container,) = pod["spec"]["containers"]
    return container


def run_hook(container: dict, url: str) -> subprocess.CompletedProcess:
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env.pop("SPECSERVE_URL").startswith("http://rel-specserve:")
    command = [sys.executable if container["command"][0] == "python3" else container["command"][0],
               *container["command"][1:]]
    return subprocess.run(command, env=dict(os.environ, **env, SPECSERVE_URL=url),
                          capture_output=True, text=True, timeout=120)


def test_hook_passes_against_a_live_server(helm, server: str) -> None:
    proc = run_hook(rendered_hook(helm), server)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "GET /health -> 200" in proc.stdout
    assert "POST /v1/completions -> 200" in proc.stdout and " tokens" in proc.stdout


def test_hook_fails_when_the_model_is_wrong(helm, server: str) -> None:
    container = rendered_hook(helm, "--set", "model.servedModelName=not-served")
    proc = run_hook(container, server)
    assert proc.returncode != 0, "the hook must fail when no completion comes back"
