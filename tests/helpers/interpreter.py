"""Run a file of Triton CPU-interpreter tests in a subprocess of its own.

TRITON_INTERPRET=1 has to be set before Triton kernel modules are imported, and other test
packages import ``kernels`` too, so each interpreter suite gets a process with the variable set
(and it does not leak into the rest of the run).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_interpreter_suite(path: Path, timeout: int = 540) -> str:
    """pytest ``path`` under the interpreter; fails unless every case ran and passed. Returns
    pytest's summary line."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"interpreter tests failed:\n{tail}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
    return proc.stdout.strip().splitlines()[-1]
