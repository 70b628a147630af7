"""Clocks, copy bandwidth, percentiles and the environment record of a benchmark run."""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, TypeVar

import torch

from specserve.engine.runner.cuda_graphs import collector_paused

T = TypeVar("T")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> list[float]:
    """Seconds per call of ``fn``: the device is synchronised before and after every call.

    Synchronised wall clocks (not CUDA events) so that host overhead — Python, input building,
    kernel launches — is part of the number, as it is part of a real decode step.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def capture_graph(fn: Callable[[], T]) -> tuple[torch.cuda.CUDAGraph, T]:
    """``fn`` run once on a side stream (the warm-up: Triton compiles, libraries pick their
    kernels), then captured as a CUDA graph with the cyclic collector paused. Returns the graph
    and what the captured call returned: its tensors are the graph's outputs. Keep them, and
    every input ``fn`` reads, alive while the graph is replayed (a freed input is read anyway)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        out = fn()
    return graph, out


def graph_us_per_call(fn: Callable[[], object], calls: int, replays: int) -> float:
    """Microseconds per call of ``fn`` (CUDA): ``calls`` calls captured in one CUDA graph (after
    two eager warm-up calls), replayed ``replays`` times between CUDA events. Launch gaps
    inside the graph count, host launch overhead does not: a kernel as a captured forward runs it."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with collector_paused(), torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (replays * calls)


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def percentile(xs: Sequence[float], q: float) -> Optional[float]:
    """Linear-interpolated percentile, q in [0, 100]; None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


@dataclass(frozen=True)
class Bandwidth:
    """Device-to-device copy bandwidth: bytes read + written per second."""

    bytes_per_s: float           # median over repeats
    best_bytes_per_s: float
    buffer_bytes: int
    repeats: int
    method: str

    def as_dict(self) -> dict:
        return {"bytes_per_s": self.bytes_per_s, "best_bytes_per_s": self.best_bytes_per_s,
                "buffer_bytes": self.buffer_bytes, "repeats": self.repeats, "method": self.method}


def copy_bandwidth(device: torch.device, nbytes: int, repeats: int = 20, warmup: int = 3) -> Bandwidth:
    """Copy one ``nbytes`` buffer into another; bandwidth = 2 * nbytes / time (median of repeats).

    On CUDA each copy is bracketed by CUDA events (pure device time); on CPU by wall clocks.
    """
    n = nbytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)   # [n]
    dst = torch.empty_like(src)                                # [n]
    for _ in range(warmup):
        dst.copy_(src)
    synchronize(device)
    times = []
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(repeats)]
        for start, end in events:
            start.record()
            dst.copy_(src)
            end.record()
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in events]
        method = "torch copy_, CUDA events"
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        method = "torch copy_, wall clock"
    moved = 2 * n * 4
    del src, dst
    return Bandwidth(moved / median(times), moved / min(times), n * 4, repeats, method)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def environment(device: torch.device, command: str) -> dict:
    """Date, device, library versions and the command line: what a result table must state."""
    def version(mod: str) -> Optional[str]:
        try:
            return __import__(mod).__version__
        except Exception:   # noqa: BLE001 - a missing optional library is just "absent"
            return None

    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_name(device),
        "device_type": device.type,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": version("triton"),
        "transformers": version("transformers"),
        "command": command,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device_memory_bytes"] = int(props.total_memory)
        env["device_capability"] = f"{props.major}.{props.minor}"
    return env
