"""engine/runner/warmup.py: the start-up warm-up of the eager forward (run on CUDA; here forced
on CPU) fits the cache it is given, takes no blocks, and leaves no trace in what requests get."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from specserve.engine.runner.warmup import eager_shapes, warm_up_eager  # noqa: E402
from specserve.engine.types import SamplingParams  # noqa: E402


def test_warm_up_runs_every_shape_on_a_small_cache_and_leaves_outputs_unchanged(make_llm, prompts) -> None:
    kw = dict(draft_model="qwen2", num_speculative_tokens=3, num_kv_blocks=12, max_model_len=160)
    cold, warmed = make_llm("llama", **kw), make_llm("llama", **kw)
    rows = 4
    shapes = eager_shapes(rows)
    assert warm_up_eager(warmed.core.runner, rows) == 0          # CUDA only by default
    ran = warm_up_eager(warmed.core.runner, rows, cuda_only=False)
    # the target runs each shape once, and a mixed step beside it when several requests; the draft once
    assert ran == sum(2 if n > 1 else 1 for n, _ in shapes) + len(shapes)
    warmed.core.kv.pool.check_all_free()
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    batch = prompts([7, 30, 17], seed=3)
    want = [o.outputs[0].token_ids for o in cold.generate(batch, params)]
    got = [o.outputs[0].token_ids for o in warmed.generate(batch, params)]
    assert got == want
