"""What verification and drafting cost at batch 1, on the runner's own forward.

* verify ratio: one target forward over k+1 tokens (logits at every position, as verification
  needs) divided by one target forward over 1 token, both after ``context`` earlier positions.
  Batch-1 decode is bandwidth-bound, so ideally the ratio stays near 1 for small k. Each forward
  runs the way a step would run it (a CUDA graph where one was captured for that query length,
  else eager); the eager/eager ratio is reported beside it so a row never compares a graph with
  an eager launch without saying so.
* draft step: one draft forward over 1 token, against the draft's own roofline
  (draft bytes per step / bandwidth). A launch-bound draft shows up here as a large ratio.
* draft program: what a step really runs to propose k drafts for one request: the catch-up
  pass, k - 1 one-token passes and k samplings as one device program (CUDA graphs), from host
  inputs to the host's read of the drafts; per draft token against the same roofline.
"""

from __future__ import annotations

from typing import Optional, Sequence

from specserve.bench.engines import forward_items, time_forward, weight_bytes
from specserve.bench.timing import median, time_calls
from specserve.engine.core import EngineCore
from specserve.engine.request import Request
from specserve.engine.runner.draft_loop import LoopRow
from specserve.engine.types import SamplingParams


def verify_costs(core: EngineCore, ks: Sequence[int], context: int, warmup: int,
                 repeats: int) -> dict:
    """Median forward times at batch 1: 1 token, k+1 tokens for each k (as run, and eager)."""
    d = time_forward(core, "target", 1, 1, context, warmup, repeats)
    d_eager = time_forward(core, "target", 1, 1, context, warmup, repeats, eager=True) if d.graph else d
    rows = []
    for k in ks:
        v = time_forward(core, "target", 1, k + 1, context, warmup, repeats)
        v_eager = time_forward(core, "target", 1, k + 1, context, warmup, repeats, eager=True) if v.graph else v
        rows.append({"k": k, "tokens": k + 1, "seconds": v.seconds, "graph": v.graph,
                     "ratio_to_decode": v.seconds / d.seconds,
                     "eager_seconds": v_eager.seconds, "eager_ratio": v_eager.seconds / d_eager.seconds})
    return {"context": context, "decode_seconds": d.seconds, "decode_graph": d.graph,
            "decode_eager_seconds": d_eager.seconds, "verify": rows}


def draft_cost(core: EngineCore, bandwidth_bytes_per_s: float, context: int, warmup: int,
               repeats: int) -> dict:
    """One draft-model step (1 token, batch 1) vs the draft's bandwidth roofline."""
    td = time_forward(core, "draft", 1, 1, context, warmup, repeats)
    tt = time_forward(core, "target", 1, 1, context, warmup, repeats)
    wb = weight_bytes(core.runner.draft)
    roof_s = wb["bytes_per_decode_step"] / bandwidth_bytes_per_s
    return {**wb, "context": context, "draft_step_seconds": td.seconds, "draft_graph": td.graph,
            "roofline_step_seconds": roof_s, "ratio_to_roofline": td.seconds / roof_s,
            "target_step_seconds": tt.seconds, "c": td.seconds / tt.seconds}


def draft_program_cost(core: EngineCore, bandwidth_bytes_per_s: Optional[float], context: int,
                       warmup: int, repeats: int, batch: int = 1) -> dict:
    """The proposal program (draft_loop.py) for ``batch`` sampled requests after ``context``
    tokens each; per draft token against the draft's roofline when the bandwidth is given."""
    runner = core.runner
    loop = runner.draft_loop
    if loop is None:
        raise ValueError("this engine has no draft model")
    k = loop.k_max
    rows = []
    for i, item in enumerate(forward_items(batch, 2, context, runner.block_size,
                                           core.info.num_kv_blocks, runner.vocab_size)):
        req = Request(f"bench-draft-{i}", item.token_ids * (context // 2 + 1),
                      SamplingParams(temperature=1.0), seed=i, eos_token_ids=(), max_tokens=k + 1,
                      arrival=0.0)
        req.block_ids = item.block_ids
        rows.append(LoopRow(req, item.token_ids, context, k, 1))
    secs = median(time_calls(lambda: loop.run(rows), runner.device, warmup, repeats))
    out = {"k": k, "batch": batch, "context": context, "program_seconds": secs,
           "per_draft_seconds": secs / k, "graph": bool(loop.graphs)}
    if bandwidth_bytes_per_s:
        roof_s = weight_bytes(runner.draft)["bytes_per_decode_step"] / bandwidth_bytes_per_s
        out.update(roofline_step_seconds=roof_s, ratio_to_roofline=secs / k / roof_s)
    return out
