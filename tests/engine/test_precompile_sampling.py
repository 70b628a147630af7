"""The engine's use of the compile workers (engine/setup.py ``precompile_sampling``): CUDA with
Triton kernels only, and never a reason for a server not to start."""

from __future__ import annotations

import logging

import torch

from specserve.engine import setup
from specserve.engine.config import EngineConfig


def test_only_cuda_with_triton_kernels_and_no_tensor_parallelism(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(setup, "compile_in_workers", lambda job, n: calls.append(job))
    cfg = EngineConfig(compile_workers=4)
    setup.precompile_sampling(cfg, 100, 4, 64, torch.float32, torch.device("cpu"), "triton")
    setup.precompile_sampling(cfg, 100, 4, 64, torch.float32, torch.device("cuda"), "torch")
    setup.precompile_sampling(EngineConfig(compile_workers=4, tensor_parallel_size=2), 100, 4, 64,
                              torch.float32, torch.device("cuda"), "triton")
    assert calls == []


def test_a_failure_is_logged_and_the_start_up_goes_on(monkeypatch, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="specserve.engine")

    def broken(job, n):
        raise RuntimeError("no device here")
    monkeypatch.setattr(setup, "compile_in_workers", broken)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    setup.precompile_sampling(EngineConfig(compile_workers=4), 100, 4, 64, torch.bfloat16,
                              torch.device("cuda"), "triton")
    assert "compiling in workers failed (RuntimeError: no device here)" in caplog.text


def test_the_workers_get_the_runners_warm_up_arguments(monkeypatch) -> None:
    from specserve.engine.runner.settings import SpecSettings
    jobs = []
    monkeypatch.setattr(setup, "compile_in_workers", lambda job, n: jobs.append((job, n)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cfg = EngineConfig(compile_workers=3, max_num_seqs=48)
    setup.precompile_sampling(cfg, 1000, 5, 64, torch.bfloat16, torch.device("cuda"), "triton")
    (job, n), = jobs
    runner_args = (1000, 48, *SpecSettings(5, 64).sampler_warm_up)   # ModelRunner._warm_up_sampling
    assert n == 3
    assert (job.vocab, job.max_reqs, job.max_drafts, job.method, job.with_probs,
            job.store_probs) == runner_args
    assert (job.dtype, job.device) == ("bfloat16", "cuda:0")
