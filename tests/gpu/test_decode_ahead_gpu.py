"""Decode-ahead on a real GPU (engine/decode_ahead.py): with CUDA graphs and real layer shapes the
step queued before the previous one is read gives the tokens of the synchronous engine.

Run on the GPU machine: ``pytest -m gpu tests/gpu/test_decode_ahead_gpu.py``. Both engines run
the same batches in the same order through the same graphs, so greedy and seeded outputs are
expected identical, bf16 included.
"""

from __future__ import annotations

import pytest
import torch

from specserve.engine import LLM, SamplingParams
from tests.gpu.test_engine_gpu import PROMPTS, _qwen3_like

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PARAMS = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True),
          SamplingParams(temperature=1.0, seed=5, max_tokens=33, ignore_eos=True),
          SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=9, max_tokens=47,
                         stop_token_ids=[7, 11, 13]),
          SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)] * 2


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return _qwen3_like(tmp_path_factory.mktemp("ahead"), "target", 4096, 4, 32, 12288, tied=False)


def _run(target: str, ahead: bool, eager: bool) -> tuple[list, int]:
    llm = LLM(target, load_format="dummy", device="cuda", num_kv_blocks=512, max_num_seqs=16,
              enforce_eager=eager, async_scheduling=ahead)
    outs = llm.generate(PROMPTS, PARAMS)
    llm.core.kv.pool.check_all_free()
    steps = llm.core.decode_ahead.num_ahead_steps if ahead else 0
    del llm
    torch.cuda.empty_cache()
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs], steps


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_decode_ahead_matches_the_synchronous_engine(target, eager):
    sync, _ = _run(target, False, eager)
    ahead, steps = _run(target, True, eager)
    assert steps >= 20
    assert ahead == sync


def test_abort_with_a_step_queued_on_the_gpu(target):
    llm = LLM(target, load_format="dummy", device="cuda", num_kv_blocks=512, max_num_seqs=16)
    core = llm.core
    for i, p in enumerate(PROMPTS[:4]):
        core.add_request(f"r{i}", p, SamplingParams(temperature=1.0, seed=i, max_tokens=30,
                                                    ignore_eos=True))
    for _ in range(6):
        core.step()
    assert core.decode_ahead.pending is not None
    core.abort(["r0", "r2"])
    lengths = {}
    while core.has_unfinished():
        for o in core.step()[0]:
            assert o.request_id in ("r1", "r3")
            lengths[o.request_id] = len(o.outputs[0].token_ids)
    assert lengths == {"r1": 30, "r3": 30}
    core.kv.pool.check_all_free()
