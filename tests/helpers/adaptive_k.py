"""Test hooks for the adaptive k controller: replace its decisions by chosen or random k."""

from __future__ import annotations

import random
from typing import Callable, Optional

from specserve.engine.spec_control import Decision, Row


def force_k(core, choose: Optional[Callable[[Row], int]]) -> None:
    """Every later step gives each sampling request ``choose(row)`` drafts (clipped to what it
    may still take); None hands the decision back to the controller."""
    assert core.spec_control is not None, "the engine has no draft model"
    core.spec_control.controller.force = choose


def force_random_k(core, seed: int, low: int = 0, high: Optional[int] = None) -> None:
    """A uniformly random k in [low, high] (high: k_max) per request per step."""
    rng = random.Random(seed)
    top = core.spec_control.controller.k_max if high is None else high
    force_k(core, lambda row: rng.randint(low, top))


def script_k(core, k_of: Callable[[int], int]) -> None:
    """The adaptive controller's n-th decision becomes ``k_of(n)`` for every sampling request
    (clipped to what it may still take), each step decided in full (no held steps). Unlike
    ``force_k`` the controller stays adaptive: at k = 0 the steps run ahead (decode-ahead) and
    a step leaving 0 is planned before the previous one is read, as under the real controller."""
    ctl = core.spec_control.controller
    count = [0]

    def decide(rows: list[Row]) -> Decision:
        k = k_of(count[0])
        count[0] += 1
        ctl.current = k
        return ctl._keep(Decision([min(k, r.budget) for r in rows], k))
    ctl.decide = decide
    ctl.hold_zero = lambda batch: False
