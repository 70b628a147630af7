"""The fused decoder layer against the layer run op by op, under the CPU interpreter.

The cases live in tests/kernels/_triton_decoder_layer_interp.py and run here in a subprocess
(TRITON_INTERPRET=1 has to be set before Triton kernel modules are imported).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INTERP_TESTS = Path(__file__).with_name("_triton_decoder_layer_interp.py")


def test_interpreter_suite() -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(INTERP_TESTS)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=540)
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"interpreter tests failed:\n{tail}"
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
    print(proc.stdout.strip().splitlines()[-1])
