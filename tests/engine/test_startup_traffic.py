"""engine/startup_traffic.py: start-up requests (run on CUDA; here forced on CPU) end clean,
leave the engine's seed stream alone and change nothing a later request gets."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from specserve.engine.startup_traffic import run_startup_traffic, wave_sizes  # noqa: E402
from specserve.engine.types import SamplingParams  # noqa: E402
from tests.conftest import assert_engine_clean  # noqa: E402


@pytest.mark.parametrize("blocks", [None, 14])   # 14 blocks: prompts refused or preempted
def test_startup_traffic_ends_clean_and_leaves_later_outputs_unchanged(make_llm, prompts, blocks) -> None:
    kw = dict(draft_model="qwen2", num_speculative_tokens=3, max_num_seqs=8, num_kv_blocks=blocks,
              max_model_len=200)
    cold, warmed = make_llm("llama", **kw), make_llm("llama", **kw)
    assert wave_sizes(8) == [1, 8]
    assert run_startup_traffic(warmed.core) == 0                 # CUDA only by default
    assert run_startup_traffic(warmed.core, cuda_only=False) > 0
    assert_engine_clean(warmed.core)
    batch = prompts([9, 21, 5], seed=4)
    for params in (SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True),
                   SamplingParams(temperature=1.0, max_tokens=20, ignore_eos=True),             # unseeded
                   SamplingParams(temperature=0.8, top_p=0.9, max_tokens=20, ignore_eos=True, seed=5)):
        want = [o.outputs[0].token_ids for o in cold.generate(batch, params)]
        got = [o.outputs[0].token_ids for o in warmed.generate(batch, params)]
        assert got == want
