"""scripts/graph_kernel_profile.py's arithmetic: kernel events of several CUDA-graph replays read
back as one replay (median duration and idle gap per launch position, totals per kernel name).
The profiler itself needs a GPU; these are Chrome-trace events as torch.profiler writes them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "graph_kernel_profile.py"


@pytest.fixture(scope="module")
def gkp():
    spec = importlib.util.spec_from_file_location("graph_kernel_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replay(t0: float, launches: list[tuple[str, float, float]]) -> list[dict]:
    """Events of one replay starting at t0: (name, gap before, duration) per launch."""
    events, t = [], t0
    for name, gap, dur in launches:
        t += gap
        events.append({"cat": "kernel", "name": name, "ts": t, "dur": dur,
                       "args": {"grid": [4, 1, 1], "block": [128, 1, 1]}})
        t += dur
    return events


def test_replays_fold_into_one_with_medians_gaps_and_totals(gkp) -> None:
    # three replays; the middle one slower at the second launch and with wider gaps; the last
    # gemv overlaps the attention before it (PDL)
    shapes = [[("gemv", 0, 4.0), ("attn", 0.5, 6.0), ("gemv", -1.0, 3.0)],
              [("gemv", 0, 4.0), ("attn", 2.5, 9.0), ("gemv", 1.0, 3.0)],
              [("gemv", 0, 4.0), ("attn", 0.5, 6.0), ("gemv", -1.0, 3.0)]]
    events = [e for i, launches in enumerate(shapes) for e in _replay(100.0 * i, launches)]
    prof = gkp.summarize(events, replays=3)
    assert [x["name"] for x in prof["launches"]] == ["gemv", "attn", "gemv"]
    assert [x["dur_us"] for x in prof["launches"]] == [4.0, 6.0, 3.0]           # medians
    assert [x["gap_us"] for x in prof["launches"]] == [0.0, 0.5, -1.0]
    assert prof["launches"][0]["grid"] == [4, 1, 1]
    assert prof["wall_us"] == pytest.approx(4.0 + 0.5 + 6.0 - 1.0 + 3.0)
    assert prof["kernel_us"] == pytest.approx(13.0)
    by_name = {r["name"]: r for r in prof["by_name"]}
    assert by_name["gemv"] == {"name": "gemv", "launches": 2, "dur_us": 7.0, "gap_us": -1.0}
    assert prof["by_name"][0]["name"] == "gemv"                                 # most time first
    text = gkp.report("t", prof)
    assert "| gemv | 2 | 7.0 | -1.0 | 3.50 |" in text and "| 1 | attn |" in text


def test_events_that_do_not_split_into_the_replays_are_refused(gkp) -> None:
    events = _replay(0.0, [("a", 0, 1.0), ("b", 0, 1.0), ("c", 0, 1.0)])
    with pytest.raises(RuntimeError, match="do not split"):
        gkp.summarize(events, replays=2)
    shuffled = _replay(0.0, [("a", 0, 1.0), ("b", 0, 1.0)]) + _replay(10.0, [("b", 0, 1.0), ("a", 0, 1.0)])
    with pytest.raises(RuntimeError, match="same launches"):
        gkp.summarize(shuffled, replays=2)


def test_only_device_activities_are_read_in_start_order(gkp, tmp_path) -> None:
    import json

    trace = {"traceEvents": [{"cat": "kernel", "name": "late", "ts": 5.0, "dur": 1.0},
                             {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 0.0, "dur": 9.0},
                             {"cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 3.0, "dur": 1.0},
                             {"cat": "kernel", "name": "early", "ts": 1.0, "dur": 1.0},
                             {"ph": "M", "name": "process_name"}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    assert [e["name"] for e in gkp._kernel_events(str(path))] == ["early", "Memcpy DtoD", "late"]
