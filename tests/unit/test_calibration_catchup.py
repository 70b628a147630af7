"""The draft catch-up's price at start-up: a launch-bound small forward and a compute-bound
large one (engine/runner/calibration.py ``_catchup_cost``, spec_control ``catchup_seconds``).

A stand-in runner whose draft forward sleeps max(fixed, tokens x rate) plays a device; the
calibration times it with the wall clock as it times the real forward."""

from __future__ import annotations

import time

import pytest
import torch

from specserve.engine.runner.calibration import _catchup_cost
from specserve.engine.spec_control import Calibration, CostModel


class _SleepingRunner:
    vocab_size, block_size, device = 100, 16, torch.device("cpu")

    def __init__(self, fixed: float, per_token: float, num_blocks: int = 64):
        self.fixed, self.per_token = fixed, per_token
        self.draft_kv = [(torch.zeros(num_blocks, 16, 1, 1), torch.zeros(num_blocks, 16, 1, 1))]
        self.sizes: list[int] = []

    def _draft_forward(self, items) -> None:
        n = sum(len(it.token_ids) for it in items)
        self.sizes.append(n)
        graph = getattr(self, "ragged", {}).get("draft")
        if graph is not None and n <= graph.max_tokens:
            time.sleep(max(graph.fixed, n * graph.per_token))
        else:
            time.sleep(max(self.fixed, n * self.per_token))


class _Graphs:
    """Stands in for the draft's ragged graphs: up to ``max_tokens`` a replay costs
    max(fixed, n x per_token)."""

    def __init__(self, max_tokens: int, fixed: float, per_token: float):
        self.max_tokens, self.fixed, self.per_token = max_tokens, fixed, per_token


def _price(runner) -> CostModel:
    price = _catchup_cost(runner, k_max=4, rows=16, warmup=1, repeats=3)
    return CostModel(Calibration([1], [1], [[0.01]], [0.001], **price))


def test_a_small_catch_up_is_priced_at_its_launches_and_a_large_one_at_its_tokens():
    """10 ms per forward, 20 us a token beyond 500 tokens: one row's 37-token catch-up costs
    10 ms, 256 rows' 40k tokens 0.8 s. Two launch-bound points (1 x 32 and 16 x 32, as before)
    price both at 10 ms: a probe at batch 256 paid 80x its price."""
    runner = _SleepingRunner(0.010, 20e-6)
    cost = _price(runner)
    assert max(runner.sizes) >= 2048                     # the large point is compute-bound here
    assert cost.catchup_seconds(37) == pytest.approx(0.010, rel=0.5)
    assert cost.catchup_seconds(40_000) == pytest.approx(0.8, rel=0.5)


def test_a_cache_too_small_for_the_large_point_still_prices_both_ends():
    runner = _SleepingRunner(0.004, 20e-6, num_blocks=4)     # 3 blocks of 16: 48 tokens a row
    cost = _price(runner)
    assert max(runner.sizes) == 16 * 48
    assert cost.catchup_seconds(10) == pytest.approx(0.004, rel=0.5)
    assert cost.catchup_seconds(40_000) >= 0.4


def test_with_ragged_graphs_a_catch_up_up_to_their_size_is_priced_as_a_replay():
    """Eager: 10 ms a forward, 20 us a token beyond 500; replayed (up to 1,024 tokens): 1 ms,
    2 us a token. A 37-token catch-up costs 1 ms, 1,000 tokens 2 ms, 40k tokens (eager) 0.8 s;
    the eager price, measured with the graphs set aside, stays what it was."""
    runner = _SleepingRunner(0.010, 20e-6)
    runner.ragged = {"draft": _Graphs(1024, 0.001, 2e-6), "target": object()}
    cost = _price(runner)
    assert set(runner.ragged) == {"draft", "target"}          # put back after the eager points
    cal = cost.cal
    assert cal.catchup_graph_tokens == 1024
    assert cost.catchup_seconds(37) == pytest.approx(0.001, rel=0.5)
    assert cost.catchup_seconds(1000) == pytest.approx(0.002, rel=0.5)
    assert cost.catchup_seconds(40_000) == pytest.approx(0.8, rel=0.5)
    assert cal.catchup_fixed == pytest.approx(0.010, rel=0.5)
    assert 1024 in runner.sizes and 2048 in runner.sizes
