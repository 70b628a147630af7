"""The Triton layer kernels (kernels/triton_layers.py, with the paged attention of
kernels/triton_attention.py it forwards to) vs the torch reference, under the CPU interpreter.

The cases live in tests/kernels/_triton_layers_interp.py and run here in a subprocess:
TRITON_INTERPRET=1 has to be set before Triton kernel modules are imported, and other test
packages import ``kernels`` too, so the interpreter tests get a process of their own.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.interpreter import run_interpreter_suite

INTERP_TESTS = Path(__file__).with_name("_triton_layers_interp.py")


def test_interpreter_suite() -> None:
    pytest.importorskip("triton")
    print(run_interpreter_suite(INTERP_TESTS, timeout=540))
