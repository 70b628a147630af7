"""Programmatic dependent launch (kernels/pdl.py) changes when kernels start, never what they compute.

Run on the GPU machine (sm_90+): ``pytest -m gpu tests/gpu/test_pdl_gpu.py``. A decode-shaped
forward of a 0.6B-shaped model (four of its layers, dummy bf16 weights, 8 requests with
contexts of 200-900 tokens in the paged cache, split-KV attention and split-K GEMVs included)
runs eagerly without PDL once: the reference. The same forward captured in a CUDA graph with
PDL, replayed many times, and eagerly with PDL, must equal it bit for bit: a kernel that read
its input before the kernel before it had finished writing would differ somewhere.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BLOCK = 16
REPLAYS = 50


def _needs_hopper() -> None:
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90 or later")


def _setup(tmp_path, rows: int):
    from specserve.bench import shapes
    from specserve.engine.models.llama import AttentionMetadata
    from specserve.engine.models.loader import load_model
    from specserve.engine.models.spec import read_model_spec
    from specserve.kernels.backend import set_backend

    set_backend("triton")
    shape = replace(shapes.QWEN3_06B_LIKE, name="pdl-probe", num_layers=4)
    spec = read_model_spec(str(shapes.write_checkpoint(tmp_path / "m", shape)))
    dev = torch.device("cuda")
    model = load_model(spec, dev, torch.bfloat16, 4096, "dummy", seed=3)
    gen = torch.Generator(device=dev).manual_seed(5)
    ctx = torch.randint(200, 900, (rows,), generator=gen, device=dev)
    blocks_per_req = 1024 // BLOCK
    num_blocks = rows * blocks_per_req
    kv = [tuple(torch.randn(num_blocks, BLOCK, spec.num_kv_heads, spec.head_dim, generator=gen,
                            device=dev).to(torch.bfloat16) for _ in range(2))
          for _ in range(spec.num_layers)]
    tables = torch.arange(num_blocks, device=dev, dtype=torch.int32).reshape(rows, blocks_per_req)
    positions = ctx.clone()                                       # each request's next token
    slots = (tables[torch.arange(rows, device=dev), positions // BLOCK].long() * BLOCK
             + positions % BLOCK)
    meta = AttentionMetadata(slot_mapping=slots, block_tables=tables,
                             query_start_loc=torch.arange(rows + 1, device=dev, dtype=torch.int32),
                             seq_lens=(ctx + 1).int(), max_query_len=1,
                             max_seq_len=int(ctx.max()) + 1)
    ids = torch.randint(0, spec.vocab_size, (rows,), generator=gen, device=dev)

    def forward() -> torch.Tensor:
        return model.compute_logits(model(ids, positions, meta, kv))

    return forward


@pytest.mark.parametrize("rows", [1, 8])
def test_pdl_forward_equals_plain_launches(tmp_path, rows: int) -> None:
    _needs_hopper()
    from specserve.kernels import pdl

    forward = _setup(tmp_path, rows)
    try:
        pdl.set_enabled(False)
        want = forward().clone()
        pdl.set_enabled(True)
        assert pdl.active(want)
        eager = forward().clone()
        torch.testing.assert_close(eager, want, rtol=0, atol=0)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()                                  # compile outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = forward()
        for i in range(REPLAYS):
            graph.replay()
            assert torch.equal(out, want), f"replay {i}: PDL changed the logits"
        torch.cuda.synchronize()
    finally:
        pdl.set_enabled(True)
