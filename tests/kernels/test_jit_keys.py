"""Every process keys the kernels alike (kernels/jit_keys.py): the compile workers of
kernels/precompile.py leave their kernels in Triton's disk cache under the keys the server's
own launches will look up, whatever each process launched first. Without settle_cache_keys
these orders gave three different keys for final_race_kernel (Triton 3.6)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from specserve.kernels.interpreter import interpreting  # noqa: E402

if interpreting():
    pytest.skip("interpreted kernels have no cache keys", allow_module_level=True)

MODULES = ("sampling_triton_kernels", "triton_layers", "triton_gemv", "triton_decode_attention")

_PROBE = """
import importlib, json, sys
import triton
first = sys.argv[1].split(",")
mods = [importlib.import_module("specserve.kernels." + m) for m in sys.argv[2].split(",")]
for name in first:          # these keys are asked for before any other
    for m in mods:
        if hasattr(m, name):
            getattr(m, name).cache_key
print(json.dumps({f"{m.__name__}.{k}": v.cache_key for m in mods for k, v in vars(m).items()
                  if isinstance(v, triton.runtime.JITFunction)}))
"""


def _keys(first: str, modules: tuple[str, ...]) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, first, ",".join(modules)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_the_same_keys_whatever_was_asked_first_or_imported_first() -> None:
    a = _keys("final_race_kernel", MODULES)
    b = _keys("row_pass_kernel,finalize_kernel,final_race_kernel", MODULES)
    c = _keys("draft_finish_kernel,final_race_kernel", tuple(reversed(MODULES)))
    assert len(a) > 30
    assert a == b == c
