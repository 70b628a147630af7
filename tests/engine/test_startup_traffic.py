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


@pytest.fixture
def traffic_on_cpu(monkeypatch):
    """EngineCore runs its start-up traffic on CPU too; yields the steps each run took."""
    import specserve.engine.core as core_mod

    steps: list[int] = []

    def run(core):
        steps.append(run_startup_traffic(core, cuda_only=False))
        return steps[-1]

    monkeypatch.setattr(core_mod, "run_startup_traffic", run)
    return steps


def test_an_engine_starts_cold_after_its_startup_traffic(make_llm, traffic_on_cpu) -> None:
    """Adaptive k calibrates next, writing blocks no request owns: no prefix-cache entry of the
    start-up requests may survive into serving (one did, and a replayed start-up prompt then
    read the calibration's KV)."""
    llm = make_llm("llama", draft_model="qwen2", num_speculative_tokens=3, max_num_seqs=8,
                   num_kv_blocks=22, max_model_len=256, speculative_k="adaptive")
    assert traffic_on_cpu and traffic_on_cpu[0] > 0
    pool = llm.core.kv.pool
    assert not pool.cached and pool.num_free == llm.core.kv.num_blocks
    assert_engine_clean(llm.core)


def test_a_context_too_short_for_the_traffic_still_starts(make_llm, traffic_on_cpu) -> None:
    llm = make_llm("llama", draft_model="qwen2", num_speculative_tokens=3, max_model_len=11)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
    assert_engine_clean(llm.core)
