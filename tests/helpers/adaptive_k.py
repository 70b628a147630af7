"""Test hook for the adaptive k controller: replace its decision by random k every step."""

from __future__ import annotations

import random
from typing import Callable, Optional

from specserve.engine.spec_control import Row


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
