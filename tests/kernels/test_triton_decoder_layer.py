"""The fused decoder layer against the layer run op by op, under the CPU interpreter.

The cases live in tests/kernels/_triton_decoder_layer_interp.py and run here in a subprocess
(TRITON_INTERPRET=1 has to be set before Triton kernel modules are imported).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.interpreter import run_interpreter_suite

INTERP_TESTS = Path(__file__).with_name("_triton_decoder_layer_interp.py")


def test_interpreter_suite() -> None:
    pytest.importorskip("triton")
    print(run_interpreter_suite(INTERP_TESTS, timeout=540))
