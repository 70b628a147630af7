"""Programmatic dependent launch (kernels/triton_pdl.py) on a real GPU: a 0.6B-like model's 1-token
forward (and an 8B-like model's, at a row count that uses PDL) with its GEMV, attention,
prologue and RMSNorm kernels launched ahead of the kernel before them gives the logits of the
forward launched one kernel after the other, bit for bit, eagerly and over CUDA graph replays
whose inputs change every time.

A kernel that read its input before waiting for the kernel that writes it would read the last
replay's values (or garbage) in some replays; the replays change the tokens and the KV cache
each time so that a stale read cannot give the right bits. Run on the GPU machine:
``pytest -m gpu tests/gpu/test_pdl_gpu.py``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specserve.bench.timing import capture_graph

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
              pytest.mark.skipif(torch.cuda.is_available()
                                 and torch.cuda.get_device_capability()[0] < 9,
                                 reason="PDL needs compute capability 9.0")]

CONTEXT, BLOCK = 200, 16


def _model(tmp_path, layers: int, shape_name: str = "QWEN3_06B_LIKE"):
    from specserve.bench import shapes
    from specserve.engine.models.loader import load_model
    from specserve.engine.models.spec import read_model_spec
    from specserve.kernels import backend

    backend.set_backend("triton")
    shape = dataclasses.replace(getattr(shapes, shape_name), num_layers=layers)
    spec = read_model_spec(shapes.write_checkpoint(tmp_path / "m", shape))
    return spec, load_model(spec, torch.device("cuda"), torch.bfloat16, 2048, "dummy", 0)


@pytest.fixture(autouse=True)
def _pdl_back_on():
    yield
    from specserve.kernels import ops

    ops.set_pdl(True)


# the draft-sized model at every row count; an 8B-sized one (two layers) where its rows use PDL
@pytest.mark.parametrize("shape_name, rows", [("QWEN3_06B_LIKE", 1), ("QWEN3_06B_LIKE", 3),
                                              ("QWEN3_06B_LIKE", 8), ("QWEN3_8B_LIKE", 4)])
@torch.inference_mode()
def test_forward_with_pdl_is_bit_equal_over_graph_replays(tmp_path, shape_name: str,
                                                          rows: int) -> None:
    from specserve.engine.models.llama import AttentionMetadata
    from specserve.kernels import ops, triton_pdl

    spec, model = _model(tmp_path, layers=4 if shape_name == "QWEN3_06B_LIKE" else 2,
                         shape_name=shape_name)
    with triton_pdl.model_scope(spec.hidden_size, rows):
        assert triton_pdl.active(torch.empty(1, device="cuda")), \
            "this model's kernels must launch with PDL at this row count"
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(rows)
    per = -(-(CONTEXT + 1) // BLOCK)
    cache_shape = (rows * per + 1, BLOCK, spec.num_kv_heads, spec.head_dim)
    kv = [(torch.empty(cache_shape, device=dev, dtype=torch.bfloat16),
           torch.empty(cache_shape, device=dev, dtype=torch.bfloat16))
          for _ in range(spec.num_layers)]
    tables = torch.arange(rows * per, dtype=torch.int32, device=dev).view(rows, per)
    # requests at different lengths, so that attention splits differ between them
    lens = torch.tensor([CONTEXT - 23 * i for i in range(rows)], dtype=torch.int32, device=dev)
    pos = (lens - 1).long()
    slots = tables.gather(1, (pos // BLOCK).view(-1, 1).int()).view(-1).long() * BLOCK + pos % BLOCK
    meta = AttentionMetadata(slots, tables, torch.arange(rows + 1, dtype=torch.int32, device=dev),
                             lens, 1, CONTEXT)
    ids = torch.zeros(rows, dtype=torch.long, device=dev)

    def forward():
        x, res = model.run_layers(model.embed_tokens(ids), None, pos, meta, kv, 0, spec.num_layers)
        return model.compute_logits(model.final_norm(x, res))

    def fresh_inputs(i: int):
        g = torch.Generator(device=dev).manual_seed(1000 + i)
        new_ids = torch.randint(0, spec.vocab_size, (rows,), device=dev, generator=g)
        new_kv = [(torch.randn(cache_shape, device=dev, generator=g).to(torch.bfloat16),
                   torch.randn(cache_shape, device=dev, generator=g).to(torch.bfloat16))
                  for _ in range(spec.num_layers)]
        return new_ids, new_kv

    def load(inputs) -> None:
        ids.copy_(inputs[0])
        for (k, v), (k0, v0) in zip(kv, inputs[1]):
            k.copy_(k0)
            v.copy_(v0)

    cases = [fresh_inputs(i) for i in range(12)]
    want = []
    ops.set_pdl(False)
    for c in cases:
        load(c)
        want.append(forward().clone())
    ops.set_pdl(True)
    load(cases[0])
    launches = []
    real_options = triton_pdl.launch_options
    triton_pdl.launch_options = lambda pdl: (launches.append(pdl), real_options(pdl))[1]
    try:
        got = forward()
    finally:
        triton_pdl.launch_options = real_options
    assert any(launches), "the model's forward launched nothing with PDL"
    if shape_name != "QWEN3_06B_LIKE":   # a large model's rule is the forward's: every launch
        assert all(launches), "a large model's forward at these rows launched some kernels without PDL"
    assert torch.equal(got, want[0]), "the eager forward with PDL differs"
    load(cases[0])
    graph, out = capture_graph(forward)
    for i, c in enumerate(cases):
        load(c)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want[i]), f"replay {i}: logits differ with PDL"
