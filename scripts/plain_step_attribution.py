"""Which time the cost model learns for each decode step, around changes of k.

A tiny target and a perturbed copy as its draft (tests/helpers/checkpoints.py) on the CPU, one
greedy request, adaptive k with its decisions scripted (``script_k``: stretches at k = 0, a few
steps drafting, back to 0), so plain steps run ahead (decode-ahead) as under the real controller.
Every target forward is made slow, large against the host's few milliseconds, so that a step's
time tells how many forwards it was charged with:

* ``--device sync`` (the CPU's case): the forward runs inside the call that launches it, and
  sleeps ``--forward-ms`` first;
* ``--device async`` (a GPU's case): the launch returns at once, the forward occupies an
  emulated device for ``--forward-ms`` after the work queued before it, and reading the step's
  tokens waits until then.

``--clock virtual`` (the default) times the engine on a clock that only the emulated device
moves (the host's work takes no time): every step should read exactly ``--forward-ms``.
``--clock real`` keeps the wall clock: the host's share on top, and this machine's noise.

One line per decode step the cost model learns from (``KController.observe_step``): the k it
verified and proposed, and the step time it was fed.

    PYTHONPATH=$PWD python scripts/plain_step_attribution.py [--device async] [--clock real]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from specserve.engine import LLM, SamplingParams
from specserve.engine import core as engine_core
from specserve.engine.runner.launched import LaunchedDecode, LaunchedStep
from tests.helpers.adaptive_k import script_k
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

SCRIPT = [0] * 8 + [2] * 3 + [0] * 6 + [1] + [0] * 6 + [3] * 2 + [0] * 8   # k of each decision


class Clock:
    """The engine's clock: the wall clock, or one moved only by the emulated device."""

    def __init__(self, virtual: bool):
        self.virtual, self.now = virtual, 0.0

    def read(self) -> float:
        return self.now if self.virtual else time.monotonic()

    def spend(self, seconds: float) -> None:
        """The host is busy for ``seconds`` (a synchronous device's forward)."""
        if self.virtual:
            self.now += seconds
        else:
            time.sleep(seconds)

    def wait_until(self, t: float) -> None:
        if self.virtual:
            self.now = max(self.now, t)
        else:
            time.sleep(max(0.0, t - time.monotonic()))


def emulate_device(core, clock: Clock, forward_s: float, asynchronous: bool) -> None:
    runner = core.runner
    if not asynchronous:
        forward = runner._forward

        def slow_forward(which, items, input_ids=None):
            if which == "target":
                clock.spend(forward_s)
            return forward(which, items, input_ids)
        runner._forward = slow_forward
        return
    busy_until = [0.0]

    def queued(launch):
        def run(*args, **kw):
            launched = launch(*args, **kw)
            busy_until[0] = launched.done_at = max(busy_until[0], clock.read()) + forward_s
            return launched
        return run
    runner.launch, runner.launch_decode = queued(runner.launch), queued(runner.launch_decode)
    for cls in (LaunchedDecode, LaunchedStep):
        def collect(self, _collect=cls.collect):
            clock.wait_until(self.done_at)
            return _collect(self)
        cls.collect = collect


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--forward-ms", type=float, default=40.0, help="one target forward on the device")
    p.add_argument("--device", choices=("sync", "async"), default="sync")
    p.add_argument("--clock", choices=("virtual", "real"), default="virtual")
    p.add_argument("--tokens", type=int, default=40, help="tokens generated")
    a = p.parse_args()
    torch.set_num_threads(1)   # the tiny models gain nothing from threads; shared cores add noise
    root = Path(tempfile.mkdtemp(prefix="attribution-"))
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=5, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=7)
    llm = LLM(model=str(target), draft_model=str(draft), num_speculative_tokens=4,
              speculative_k="adaptive", device="cpu", dtype="float32")
    core = llm.core
    script_k(core, lambda n: SCRIPT[n] if n < len(SCRIPT) else 0)
    clock = Clock(a.clock == "virtual")
    engine_core.time = SimpleNamespace(monotonic=clock.read)
    emulate_device(core, clock, a.forward_ms / 1e3, a.device == "async")
    ctl = core.spec_control.controller
    fed: list[tuple[int, int, float]] = []
    observe_step = ctl.observe_step

    def recording(batch, k_verify, k_draft, tokens, seconds, *rest):
        fed.append((k_verify, k_draft, seconds))
        observe_step(batch, k_verify, k_draft, tokens, seconds, *rest)
    ctl.observe_step = recording
    core.add_request("r", list(range(5, 29)), SamplingParams(temperature=0.0, max_tokens=a.tokens,
                                                             ignore_eos=True))
    while core.has_unfinished():
        core.step()
    print(f"code from {Path(engine_core.__file__).parent}; {a.device} device, {a.clock} clock, "
          f"a target forward takes {a.forward_ms:.0f} ms")
    for i, (kv, kd, s) in enumerate(fed):
        note = ""
        if kv == kd == 0 and i + 1 < len(fed) and fed[i + 1][1] > 0:
            note = "  last plain step before leaving 0"
        elif kv == kd == 0 and i and fed[i - 1][0] > 0:
            note = "  first plain step back at 0"
        elif kv == kd == 0 and i + 1 == len(fed):
            note = "  the request's last step"
        print(f"{i:3d}  k {kv} -> {kd}  {s * 1e3:7.1f} ms{note}")
    plain = [s * 1e3 for kv, kd, s in fed if kv == kd == 0]
    print(f"plain steps: {len(plain)}, median {statistics.median(plain):.1f} ms, "
          f"min {min(plain):.1f}, max {max(plain):.1f}, mean {statistics.fmean(plain):.1f}")


if __name__ == "__main__":
    main()
