"""Compiling the sampler's kernel variants in parallel worker processes, before a cold start-up.

The sampler's warm-up (``triton_sampling.warm_up``) meets every kernel variant a server can need:
159 of them at a 152k vocabulary, k_max 8 and 256 sequences. Triton compiles one at a time in
the process that launches it, holding the GIL through most of each compile (four threads
compiled four variants no faster than one on the CPU machine), so on an empty Triton cache the
warm-up took 185 s of an H200 engine's start-up (2026-11-28).

``compile_in_workers`` splits the same warm-up calls over worker processes (``python -m
specserve.kernels.precompile``), each on the same device, before the server loads its weights.
Every worker launches exactly the calls the server's own warm-up will make (same shapes,
dtypes and flags, so the same specialisations), and Triton writes each compiled variant to its
on-disk cache. The server's warm-up then reads them from there. A marker in the cache, keyed on
the arguments, the kernels' source and the versions, lets a warm restart skip the workers.
Nothing here changes what runs: a worker that fails leaves its variants to the server's own
warm-up, as before.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

log = logging.getLogger("specserve.kernels")

_SOURCES = ("triton_sampling.py", "sampling_triton_kernels.py", "triton_pdl.py", "philox.py",
            "precompile.py")
MAX_AUTO_WORKERS = 8


@dataclass(frozen=True)
class SamplingWarmUp:
    """The arguments of ``triton_sampling.warm_up`` (the dtype by name, the device by string)."""

    vocab: int
    max_reqs: int
    max_drafts: int
    method: str
    with_probs: bool
    store_probs: bool
    dtype: str       # "bfloat16", "float16" or "float32"
    device: str      # "cuda:0", ...; "cpu" runs the Triton interpreter (tests)

    def run(self, part: int = 0, parts: int = 1) -> int:
        import torch

        from specserve.kernels import triton_sampling
        device = torch.device(self.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        return triton_sampling.warm_up(self.vocab, self.max_reqs, self.max_drafts, self.method,
                                       self.with_probs, self.store_probs,
                                       getattr(torch, self.dtype), device, part=part, parts=parts)


def auto_workers(cpus: Optional[int] = None) -> int:
    """One worker per spare core, at most ``MAX_AUTO_WORKERS`` (each holds a CUDA context and
    up to ~2 GB of warm-up tensors at k_max 8 and 256 sequences)."""
    cpus = cpus if cpus is not None else (os.cpu_count() or 1)
    return max(0, min(MAX_AUTO_WORKERS, cpus - 1))


def triton_cache_dir() -> Path:
    try:
        from triton import knobs
        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def marker_path(job: SamplingWarmUp) -> Path:
    """Where a finished run for ``job`` is recorded: the arguments, the device's name and
    capability, torch's and Triton's versions and the kernels' source all change it."""
    import torch
    import triton

    here = Path(__file__).parent
    h = hashlib.sha256(json.dumps(asdict(job), sort_keys=True).encode())
    h.update(f"{torch.__version__} {triton.__version__}".encode())
    dev = torch.device(job.device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        h.update(f"{torch.cuda.get_device_name(index)} {torch.cuda.get_device_capability(index)}".encode())
    for name in _SOURCES:
        h.update((here / name).read_bytes())
    return triton_cache_dir() / "specserve-precompiled" / h.hexdigest()[:32]


def compile_in_workers(job: SamplingWarmUp, workers: int, timeout_s: float = 900.0) -> bool:
    """Run ``job``'s warm-up split over ``workers`` processes and wait for them. True when every
    worker finished (or a marker says an earlier run did); False otherwise, with a warning: the
    caller's own warm-up then compiles what is missing."""
    if workers < 1:
        return False
    marker = marker_path(job)
    if marker.exists():
        log.info("sampling kernels: Triton's cache already holds this configuration's variants")
        return True
    t0 = time.monotonic()
    log.info("sampling kernels: compiling their variants in %d worker processes (an empty Triton "
             "cache; later start-ups read it from %s)", workers, triton_cache_dir())
    spec = json.dumps(asdict(job))
    # each worker's stderr goes to a file of its own, read only if it fails: a pipe left unread
    # while the parent waits on another worker would stall a worker that writes much
    logs = [tempfile.TemporaryFile(mode="w+") for _ in range(workers)]
    procs = [subprocess.Popen([sys.executable, "-m", "specserve.kernels.precompile", "--job", spec,
                               "--part", str(i), "--parts", str(workers)],
                              stdout=subprocess.DEVNULL, stderr=logs[i], text=True)
             for i in range(workers)]
    failed = []
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
            note = ""
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            note = f"timed out after {timeout_s:g}s"
        if p.returncode != 0:
            logs[i].seek(0)
            failed.append((i, ([note] if note else []) + logs[i].read().strip().splitlines()[-3:]))
        logs[i].close()
    seconds = time.monotonic() - t0
    if failed:
        log.warning("sampling kernels: %d of %d compile workers failed after %.1fs (the start-up "
                    "warm-up compiles their variants instead): %s", len(failed), workers, seconds,
                    "; ".join(f"worker {i}: {' | '.join(lines)}" for i, lines in failed))
        return False
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(spec + "\n")
    log.info("sampling kernels: compiled in %.1fs by %d workers", seconds, workers)
    return True


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description="One worker of compile_in_workers: run part PART of "
                                            "PARTS of the sampler's warm-up calls.")
    p.add_argument("--job", required=True, help="the SamplingWarmUp fields as JSON")
    p.add_argument("--part", type=int, required=True, help="this worker's index, 0..PARTS-1")
    p.add_argument("--parts", type=int, required=True, help="workers in all")
    a = p.parse_args(argv)
    calls = SamplingWarmUp(**json.loads(a.job)).run(a.part, a.parts)
    print(f"part {a.part} of {a.parts}: {calls} warm-up calls")


if __name__ == "__main__":
    main()
