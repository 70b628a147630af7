"""engine/runner/ragged_graphs.py: one padded forward per token bucket serves any ragged batch.

The CUDA capture itself needs a GPU (tests/gpu/test_engine_gpu.py replays it); here the same
padded forward runs eagerly on the CPU, so what a graph computes is checked: the batch's logits
and KV writes equal the unpadded eager forward's, and the padding (zero-length requests, rows of
no request) writes no KV and reaches no real row.
"""

from __future__ import annotations

import pytest

from specserve.engine.runner.inputs import ForwardItem
from specserve.engine.runner.ragged_graphs import RaggedGraphedForward, ragged_graph_bytes, token_buckets
from specserve.engine.types import SamplingParams

torch = pytest.importorskip("torch")


def test_token_buckets_up_to_the_limit():
    assert token_buckets(0) == []
    assert token_buckets(10) == [16]
    assert token_buckets(100) == [16, 32, 64, 112]     # the limit itself, to a multiple of 16
    assert token_buckets(1000) == [16, 32, 64, 128, 256, 512, 1008]
    assert token_buckets(1024) == [16, 32, 64, 128, 256, 512, 1024]


def test_graph_memory_grows_with_the_largest_bucket(make_llm):
    spec = make_llm("llama").core.runner.target.spec
    assert ragged_graph_bytes(spec, 0, 2) == 0
    small, large = ragged_graph_bytes(spec, 64, 2), ragged_graph_bytes(spec, 1024, 2)
    assert 0 < small < large
    # a 1024-token bucket holds at least one layer's MLP activations for 1024 rows
    assert large >= 1024 * 2 * spec.intermediate_size * 2


def _batches(bs: int) -> list[list[ForwardItem]]:
    """Ragged batches over blocks 1.. (block 0 stays untouched by real requests): a prompt chunk
    alone, decodes beside a chunk with earlier context, a catch-up of several requests."""
    def blocks(first: int, n: int) -> list[int]:
        return list(range(first, first + n))

    chunk = [ForwardItem(list(range(5, 45)), 0, blocks(1, 3), 1)]
    mixed = [ForwardItem([17], 20, blocks(4, 2), 1), ForwardItem([9], 3, blocks(6, 1), 1),
             ForwardItem(list(range(30, 43)), 16, blocks(7, 2), 1)]
    catch_up = [ForwardItem([11, 12, 13], 5, blocks(9, 1), 0), ForwardItem([14], 30, blocks(10, 2), 0),
                ForwardItem(list(range(50, 59)), 0, blocks(12, 1), 2)]
    return [chunk, mixed, catch_up]


@pytest.mark.parametrize("which", ["target", "draft"])
def test_the_padded_forward_equals_the_eager_one_and_writes_only_real_slots(make_llm, which):
    llm = make_llm("llama", draft_model="qwen2", num_speculative_tokens=3)
    runner = llm.core.runner
    model, kv = (runner.target, runner.target_kv) if which == "target" else (runner.draft, runner.draft_kv)
    for k, v in kv:   # context that earlier steps would have written
        k.normal_(generator=torch.Generator().manual_seed(1))
        v.normal_(generator=torch.Generator().manual_seed(2))
    ragged = RaggedGraphedForward(model, kv, 64, 6, 8, runner.max_model_len, runner.block_size,
                                  runner.device)
    for batch in _batches(runner.block_size):
        before = [(k.clone(), v.clone()) for k, v in kv]
        want = runner._forward(which, batch)
        eager_kv = [(k.clone(), v.clone()) for k, v in kv]
        for (k, v), (k0, v0) in zip(kv, before):
            k.copy_(k0)
            v.copy_(v0)
        got = ragged.run(batch)
        # the attention kernel numbers its tiles from query_start_loc: padding continues it
        n = sum(len(it.token_ids) for it in batch)
        starts = ragged.qsl.tolist()
        assert starts == sorted(starts) and starts[len(batch)] == starts[-1] == n
        if want is None:
            assert got is None
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for (k, v), (ke, ve) in zip(kv, eager_kv):
            torch.testing.assert_close(k, ke, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(v, ve, atol=1e-5, rtol=1e-5)
        # block 0, which no request of these batches owns, is exactly as it was
        for (k, v), (k0, v0) in zip(kv, before):
            assert torch.equal(k[0], k0[0]) and torch.equal(v[0], v0[0])


def test_batches_that_do_not_fit_are_refused(make_llm):
    runner = make_llm("llama").core.runner
    ragged = RaggedGraphedForward(runner.target, runner.target_kv, 32, 2, 8, runner.max_model_len,
                                  runner.block_size, runner.device)
    one = ForwardItem([5] * 20, 0, [1, 2], 1)
    assert ragged.fits([one])
    assert not ragged.fits([one, one])                               # 40 tokens > 32
    assert not ragged.fits([ForwardItem([5], 0, [1], 1)] * 3)         # 3 requests > 2
    assert not ragged.fits([ForwardItem([], 4, [1], 0)])              # nothing to feed
    assert not ragged.fits([])


def test_an_engine_whose_eager_forwards_run_padded_gives_the_same_tokens(make_llm, prompts):
    """Every prefill, mixed step and catch-up of a speculative engine goes through the padded
    forward (as on the GPU, where it is a graph replay); greedy output is unchanged."""
    kw = dict(draft_model="qwen2", num_speculative_tokens=3, speculative_k="fixed")
    plain, padded = make_llm("llama", **kw), make_llm("llama", **kw)
    runner = padded.core.runner
    used = {"target": 0, "draft": 0}
    for which, (model, kv) in {"target": (runner.target, runner.target_kv),
                               "draft": (runner.draft, runner.draft_kv)}.items():
        max_blocks = -(-(runner.max_model_len + 4) // runner.block_size)
        g = RaggedGraphedForward(model, kv, 128, padded.core.config.max_num_seqs, max_blocks,
                                 runner.max_model_len, runner.block_size, runner.device)
        run = g.run

        def counted(items, _run=run, _which=which):
            used[_which] += 1
            return _run(items)

        g.run = counted
        runner.ragged[which] = g
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    batch = prompts([7, 30, 17, 45], seed=5)
    want = [o.outputs[0].token_ids for o in plain.generate(batch, params)]
    got = [o.outputs[0].token_ids for o in padded.generate(batch, params)]
    assert got == want
    assert used["target"] > 0 and used["draft"] > 0
    padded.core.kv.pool.check_all_free()


def test_the_eager_warm_up_runs_eagerly_and_puts_the_graphs_back(make_llm):
    """warm_up_eager exists to compile the eager path's kernel variants (forwards beyond the
    graphs' size still run it): with ragged graphs present it sets them aside, then restores."""
    from specserve.engine.runner.warmup import warm_up_eager

    runner = make_llm("llama", max_model_len=160).core.runner
    g = RaggedGraphedForward(runner.target, runner.target_kv, 64, 4, 12, runner.max_model_len,
                             runner.block_size, runner.device)
    calls = []
    g.run = lambda items: calls.append(items)
    runner.ragged = {"target": g}
    assert warm_up_eager(runner, 2, cuda_only=False) > 0
    assert calls == [] and runner.ragged == {"target": g}


def test_the_uniform_graphs_pieces_compute_the_eager_forward(make_llm):
    """GraphedForward shares PiecewiseGraphs with the ragged graphs; its capture needs a GPU, but
    its pieces, run eagerly on staged static buffers, must give the eager forward's logits."""
    from specserve.engine.runner.cuda_graphs import GraphedForward

    runner = make_llm("llama").core.runner
    g = GraphedForward(runner.target, runner.target_kv, 3, 4, 8, runner.max_model_len,
                       runner.block_size, runner.device)
    items = [ForwardItem([5, 6, 7], 10, [1], 3), ForwardItem([9, 10, 11], 4, [2], 3)]
    want = runner._forward("target", items)
    bs = runner.block_size
    g.input_ids[:6] = torch.tensor([5, 6, 7, 9, 10, 11])
    g.positions[:6] = torch.tensor([10, 11, 12, 4, 5, 6])
    g.slots[:6] = torch.tensor([bs + 10, bs + 11, bs + 12, 2 * bs + 4, 2 * bs + 5, 2 * bs + 6])
    g.seq_lens[:2] = torch.tensor([13, 7])
    g.block_tables[0, 0], g.block_tables[1, 0] = 1, 2
    pieces, outs = g._pieces(2)
    for piece in pieces:
        piece()
    assert len(g.pieces) == 2
    torch.testing.assert_close(outs[-1], want, atol=1e-5, rtol=1e-5)
