"""The scheduler side of the engine imports no torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["specserve.engine", "specserve.engine.types", "specserve.engine.config", "specserve.engine.errors", "specserve.engine.request", "specserve.engine.batch",
           "specserve.engine.kv_cache", "specserve.engine.scheduler", "specserve.engine.detokenizer"]


def test_scheduler_block_pool_and_requests_do_not_import_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES)
            + "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy'))\n"
            + "assert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
