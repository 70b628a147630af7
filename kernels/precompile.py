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

# host-side code that picks the variants the warm-up meets (the kernels' own source is in their
# settled cache keys, kernels/jit_keys.py)
_SOURCES = ("triton_sampling.py", "precompile.py")
MAX_AUTO_WORKERS = 8
# device memory one worker may take at its peak: a CUDA context and, at k_max 8 and 256
# sequences, fp32 random logits (1.4 GB), their bf16 copy (0.7 GB) and q rows (1.2 GB)
WORKER_BYTES = 4 << 30


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


def auto_workers(cpus: Optional[int] = None, free_bytes: Optional[int] = None) -> int:
    """One worker per spare core this process may run on, at most ``MAX_AUTO_WORKERS`` and as
    many as ``free_bytes`` of device memory hold (``WORKER_BYTES`` each); 0 where that leaves
    one or none (a single worker only adds its start-up to the server's own warm-up)."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    n = min(MAX_AUTO_WORKERS, cpus - 1)
    if free_bytes is not None:
        n = min(n, free_bytes // WORKER_BYTES)
    return int(n) if n >= 2 else 0


def triton_cache_dir() -> Path:
    try:
        from triton import knobs
        return Path(knobs.cache.dir)
    except (ImportError, AttributeError):
        return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def marker_path(job: SamplingWarmUp) -> Path:
    """Where a finished run for ``job`` is recorded: the arguments (the device by its name and
    capability, not its index), torch's and Triton's versions, the sampling kernels' settled
    cache keys and the host code that picks their variants all change it."""
    import torch
    import triton

    from specserve.kernels import sampling_triton_kernels, triton_pdl

    fields = asdict(job)
    dev = torch.device(fields.pop("device"))
    h = hashlib.sha256(json.dumps(fields, sort_keys=True).encode())
    h.update(f"{torch.__version__} {triton.__version__} {dev.type}".encode())
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        h.update(f"{torch.cuda.get_device_name(index)} {torch.cuda.get_device_capability(index)}".encode())
    for module in (triton_pdl, sampling_triton_kernels):
        for name, fn in vars(module).items():
            if isinstance(fn, triton.runtime.JITFunction):
                h.update(f"{name}={fn.cache_key};".encode())
    here = Path(__file__).parent
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
    logs = [tempfile.TemporaryFile() for _ in range(workers)]
    procs: list[subprocess.Popen] = []
    failed = []
    try:
        for i in range(workers):
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "specserve.kernels.precompile", "--job", spec,
                 "--part", str(i), "--parts", str(workers)],
                stdout=subprocess.DEVNULL, stderr=logs[i]))
        for i, p in enumerate(procs):
            try:
                p.wait(timeout=max(0.01, timeout_s - (time.monotonic() - t0)))
                note = []
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                note = [f"timed out after {timeout_s:g}s"]
            if p.returncode != 0:
                logs[i].seek(0)
                text = logs[i].read().decode("utf-8", errors="replace")
                failed.append((i, note + text.strip().splitlines()[-3:]))
    except OSError as e:   # the workers could not start: the server compiles on its own
        failed.append((len(procs), [f"{type(e).__name__}: {e}"]))
    finally:
        for p in procs:    # none outlives this call (an interrupt, an error above)
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
    seconds = time.monotonic() - t0
    if failed:
        log.warning("sampling kernels: %d of %d compile workers failed after %.1fs (the start-up "
                    "warm-up compiles their variants instead): %s", len(failed), workers, seconds,
                    "; ".join(f"worker {i}: {' | '.join(lines)}" for i, lines in failed))
        return False
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(spec + "\n")
    except OSError as e:   # a read-only cache: the next start-up runs the workers again
        log.warning("sampling kernels: could not record the compiled variants at %s: %s", marker, e)
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
