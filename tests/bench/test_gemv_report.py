"""bench/gemv.py's report: the summary picks the fastest correct config, the pasted table is
Python that builds the kernel's CONFIG_TABLE (None where cuBLAS won). No kernel runs here."""

from __future__ import annotations

from dataclasses import asdict

import pytest

pytest.importorskip("triton")

from specserve.bench import gemv  # noqa: E402
from specserve.kernels.triton_gemv import GemvConfig  # noqa: E402


def _cell(m: int, n: int, cublas_us: float, rows: list[tuple[GemvConfig, float, bool]]) -> dict:
    configs = [dict(config=asdict(c), label=c.label, us=us, ok=ok, max_err=0.0,
                    speedup=cublas_us / us) for c, us, ok in rows]
    return dict(model="m", layer="o", M=m, N=n, K=64, bytes=n * 64 * 2, weight_copies=1,
                calls_per_graph=1, cublas_us=cublas_us, cublas_max_err=0.0, out_scale=1.0,
                configs=configs)


def test_summary_and_pasted_table() -> None:
    a, b = GemvConfig(4, 512, 1, 4, 3, "late"), GemvConfig(64, 128, 2, 4, 4, "dot")
    fast_but_wrong = GemvConfig(8, 256)
    cells = [gemv._summarise(_cell(3, 128, 10.0, [(a, 6.0, True), (fast_but_wrong, 1.0, False),
                                                  (b, 5.0, True)]), 1e12),
             gemv._summarise(_cell(1, 256, 4.0, [(a, 5.0, True)]), 1e12)]
    assert cells[0]["best_label"] == b.label and cells[0]["best_speedup"] == 2.0
    src = gemv.config_table(cells)
    scope: dict = {"GemvConfig": GemvConfig, "Optional": None}
    exec(src.replace(": dict[tuple[int, int, int], Optional[GemvConfig]]", ""), scope)
    assert scope["CONFIG_TABLE"] == {(4, 128, 64): b, (1, 256, 64): None}
    cells[0].update(model="m", layer="o")
    md = gemv.markdown(dict(env=dict(device="d", date="now", torch="t", triton="tr", command="c"),
                            copy_bandwidth=dict(bytes_per_s=1e12), dtype="bfloat16",
                            rotate_bytes=gemv.ROTATE_BYTES, elapsed_s=1.0, cells=cells))
    assert "fast_but_wrong" not in md and fast_but_wrong.label in md   # listed as out of bounds
