"""The sampler's warm-up split over worker processes (kernels/precompile.py).

The split must make exactly the server's own warm-up calls, each once; the workers run for real
(``python -m specserve.kernels.precompile`` on the Triton interpreter, a small vocabulary), a
finished run is remembered in the Triton cache, and a failed one says so and is not remembered.
"""

from __future__ import annotations

import logging
from collections import Counter

import pytest
import torch

pytest.importorskip("triton")

from specserve.kernels import precompile, triton_sampling  # noqa: E402


def _calls(monkeypatch, part: int, parts: int, max_reqs: int = 16, max_drafts: int = 4) -> list:
    """The (kind, rows, widest k) of every call warm_up makes for ``part`` of ``parts``."""
    seen = []
    monkeypatch.setattr(triton_sampling, "sample_draft",
                        lambda logits, *a, **k: seen.append(("draft", logits.shape[0], None)))
    monkeypatch.setattr(triton_sampling, "rejection_sample",
                        lambda logits, cu, *a: seen.append(("verify", logits.shape[0],
                                                            len(cu) - 1, a[-1])))
    n = triton_sampling.warm_up(300, max_reqs, max_drafts, "probabilistic", False, True,
                                torch.float32, torch.device("cpu"), part=part, parts=parts)
    assert n == len(seen)
    return seen


@pytest.mark.parametrize("parts", [2, 3, 8])
def test_the_parts_make_the_whole_warm_ups_calls_each_once(monkeypatch, parts: int) -> None:
    whole = _calls(monkeypatch, 0, 1)
    assert len(whole) > parts          # every worker has calls to make
    split = [c for i in range(parts) for c in _calls(monkeypatch, i, parts)]
    assert Counter(split) == Counter(whole)


def test_a_part_outside_the_parts_is_refused(monkeypatch) -> None:
    with pytest.raises(ValueError):
        _calls(monkeypatch, 2, 2)


def test_auto_workers_leaves_a_core_caps_and_fits_the_memory() -> None:
    assert precompile.auto_workers(1) == 0
    assert precompile.auto_workers(2) == 0          # one worker would only add its start-up
    assert precompile.auto_workers(3) == 2
    assert precompile.auto_workers(128) == precompile.MAX_AUTO_WORKERS
    gb = precompile.WORKER_BYTES
    assert precompile.auto_workers(128, free_bytes=5 * gb + 1) == 5
    assert precompile.auto_workers(128, free_bytes=gb) == 0
    assert precompile.auto_workers() >= 0           # this machine's affinity


def _job(method: str = "probabilistic") -> precompile.SamplingWarmUp:
    return precompile.SamplingWarmUp(vocab=96, max_reqs=2, max_drafts=1, method=method,
                                     with_probs=True, store_probs=True, dtype="float32",
                                     device="cpu")


def test_workers_run_the_warm_up_and_a_warm_cache_skips_them(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")      # the workers' kernels run on the interpreter
    caplog.set_level(logging.INFO, logger="specserve.kernels")
    job = _job()
    assert not precompile.marker_path(job).exists()
    assert precompile.compile_in_workers(job, 2)
    assert precompile.marker_path(job).exists()
    assert "compiled in" in caplog.text

    def no_workers(*a, **k):
        raise AssertionError("a warm cache started workers")
    monkeypatch.setattr(precompile.subprocess, "Popen", no_workers)
    assert precompile.compile_in_workers(job, 2)
    assert "already holds" in caplog.text
    # another configuration is not covered by the marker
    assert precompile.marker_path(job) != precompile.marker_path(_job("strict"))


def test_failed_workers_are_reported_and_not_remembered(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    caplog.set_level(logging.INFO, logger="specserve.kernels")
    job = _job(method="no-such-method")
    assert not precompile.compile_in_workers(job, 2)
    assert "2 of 2 compile workers failed" in caplog.text
    assert "no-such-method" in caplog.text           # the worker's own error reaches the log
    assert not precompile.marker_path(job).exists()


def test_no_workers_means_nothing_runs(monkeypatch) -> None:
    monkeypatch.setattr(precompile.subprocess, "Popen",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("spawned")))
    assert not precompile.compile_in_workers(_job(), 0)


def test_workers_past_the_time_limit_are_killed_and_reported(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    caplog.set_level(logging.INFO, logger="specserve.kernels")
    job = _job()
    # importing torch alone takes longer than this
    assert not precompile.compile_in_workers(job, 2, timeout_s=0.2)
    assert "timed out after 0.2s" in caplog.text
    assert not precompile.marker_path(job).exists()


def test_workers_that_cannot_start_are_reported(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    caplog.set_level(logging.INFO, logger="specserve.kernels")

    def no_fork(*a, **k):
        raise OSError("fork refused")
    monkeypatch.setattr(precompile.subprocess, "Popen", no_fork)
    assert not precompile.compile_in_workers(_job(), 3)
    assert "fork refused" in caplog.text
