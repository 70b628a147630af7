"""Which forwards the runner captures as CUDA graphs, and the memory their logits keep (plain
arithmetic: the capture itself needs a GPU, tests/gpu)."""

from __future__ import annotations

from specserve.engine.runner.cuda_graphs import (buckets_up_to, forward_graph_plan, graph_logits_bytes,
                                                 verify_widths)


def test_every_verification_width_up_to_nine_then_17_and_k_max_plus_one():
    assert verify_widths(1) == [2]
    assert verify_widths(4) == [2, 3, 4, 5]
    assert verify_widths(8) == list(range(2, 10))
    assert verify_widths(12) == list(range(2, 10)) + [13]
    assert verify_widths(16) == list(range(2, 10)) + [17]


def test_plan_without_and_with_a_draft():
    assert forward_graph_plan(0) == [("target", 1)]
    assert forward_graph_plan(3) == [("target", 1), ("target", 2), ("target", 3), ("target", 4),
                                     ("draft", 1)]


def test_logits_bytes_count_every_width_and_bucket():
    assert buckets_up_to(4) == [1, 2, 4]
    # k_max 2: widths 1 (decode), 2, 3 (verification) and 1 (draft) = 7 rows per batch row
    assert graph_logits_bytes(2, 4, 10, 2) == (1 + 2 + 4) * 7 * 10 * 2
    assert graph_logits_bytes(0, 4, 10, 2) == (1 + 2 + 4) * 1 * 10 * 2
    # the default engine (64 sequences, k_max 8) with a 152k bf16 vocabulary: under 2 GB
    assert graph_logits_bytes(8, 64, 151936, 2) < 2 << 30


def test_captures_run_with_the_cycliccollector_paused():
    """A collection inside a capture may free another engine's CUDA graphs, a CUDA call that
    invalidates the capture (seen on an H100): the collector is off while capturing and comes
    back as it was."""
    import gc

    from specserve.engine.runner.cuda_graphs import collector_paused

    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_capture_pieces_captures_with_the_collector_paused(monkeypatch):
    """capture_pieces itself runs every capture under the pause (CUDA stand-ins record the
    collector's state when each capture begins; the warm-up pass runs with it on)."""
    import contextlib
    import gc

    import torch

    from specserve.engine.runner import cuda_graphs

    seen = []

    class FakeGraph:
        def pool(self):
            return "pool"

    @contextlib.contextmanager
    def fake_capture(graph, pool=None):
        seen.append(("capture", gc.isenabled()))
        yield

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_capture)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)

    def pieces():
        return [lambda: seen.append(("piece", gc.isenabled()))] * 2, []

    graphs, _, pool = cuda_graphs.capture_pieces(pieces, None)
    assert len(graphs) == 2 and pool == "pool"
    assert seen == [("piece", True), ("piece", True), ("capture", False), ("piece", False),
                    ("capture", False), ("piece", False)]
    assert gc.isenabled()
