"""Finding and running the real deployment tools (helm, promtool, prometheus, hadolint).

A missing tool skips the test with the command that installs it, unless the environment variable
CI is set: then it is a failure, so CI can never pass by skipping. Install everything with
``bash scripts/install_deploy_tools.sh``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "specserve"
DASHBOARD = ROOT / "deploy" / "grafana" / "specserve.json"
RULES = ROOT / "deploy" / "prometheus" / "specserve-rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "tests" / "specserve-rules.test.yml"
INSTALL_HINT = "bash scripts/install_deploy_tools.sh"

# Where tools live besides PATH: the repository's .tools/bin (helm) and the venv's bin (hadolint).
_EXTRA_DIRS = [ROOT / ".tools" / "bin", Path(sys.executable).parent]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing(what: str) -> None:
    """Skip (developer machine) or fail (CI) because ``what`` is not available."""
    message = f"{what} is not installed; run `{INSTALL_HINT}`"
    if in_ci():
        pytest.fail(f"CI is set and {message}", pytrace=False)
    pytest.skip(message)


def find_tool(name: str) -> str:
    """Absolute path of executable ``name``, or skip/fail the calling test."""
    for folder in _EXTRA_DIRS:
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        missing(name)
    return found  # type: ignore[return-value]


def need_module(name: str, pip_name: str) -> Any:
    """Import ``name``, or skip/fail the calling test like a missing tool."""
    try:
        return importlib.import_module(name)
    except ImportError:
        missing(f"the Python package {pip_name}")


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 60,
        cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


class Helm:
    """The real helm binary with private cache/config/data folders."""

    def __init__(self, home: Path):
        self.binary = find_tool("helm")
        self.env = dict(os.environ)
        for var, sub in (("HELM_CACHE_HOME", "cache"), ("HELM_CONFIG_HOME", "config"),
                         ("HELM_DATA_HOME", "data")):
            self.env[var] = str(home / sub)

    def __call__(self, *args: str) -> subprocess.CompletedProcess:
        return run([self.binary, *args], env=self.env)

    def template(self, *args: str, release: str = "rel", namespace: str = "llm") -> list[dict]:
        """``helm template`` with ``args`` (``--values F``, ``--set k=v``); the rendered objects."""
        proc = self.template_raw(*args, release=release, namespace=namespace)
        assert proc.returncode == 0, f"helm template {' '.join(args)} failed:\n{proc.stderr}"
        return [d for d in yaml.safe_load_all(proc.stdout) if d]

    def template_raw(self, *args: str, release: str = "rel",
                     namespace: str = "llm") -> subprocess.CompletedProcess:
        return self("template", release, str(CHART), "--namespace", namespace, *args)


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}: {[d['kind'] for d in docs]}"
    return found[0]


# --------------------------------------------------------------------------- dashboard helpers
def dashboard() -> dict:
    import json

    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, refId, expr) of every target of every panel."""
    return [(p["title"], t["refId"], t["expr"])
            for p in dashboard()["panels"] for t in p.get("targets", [])]


def concrete(expr: str, rate_interval: str = "1m", prefix: str = "specserve") -> str:
    """What Grafana would send with the metric prefix ``prefix`` and every other variable on "All":
    ${prefix}, $__rate_interval and $var replaced."""
    import re

    expr = expr.replace("${prefix}", prefix).replace("$__rate_interval", rate_interval)
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def as_rule_file(exprs: list[str]) -> str:
    """A Prometheus rules file recording each expression, so that promtool parses them all."""
    rules = [{"record": f"dashboard:query_{i}", "expr": e} for i, e in enumerate(exprs)]
    return yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, sort_keys=False)
