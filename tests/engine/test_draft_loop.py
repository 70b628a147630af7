"""The draft's proposal program (engine/runner/draft_loop.py) against the pass-by-pass host path.

On the CPU the program runs eagerly, padded to the same batch buckets as its CUDA graphs, so
these tests check what the GPU replays: the same drafts, probabilities and outputs as the host
path, and KV written only where a request drafts.
"""

from __future__ import annotations

import random

import pytest

from engine import SamplingParams
from tests.helpers.checkpoints import make_perturbed_copy, make_tiny_checkpoint

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft_loop")
    target = make_tiny_checkpoint(root / "target", "qwen3", seed=11, initializer_range=0.2)
    draft = make_perturbed_copy(target, root / "draft", noise=0.02, seed=13)
    return str(target), str(draft)


def _workload(seed: int) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of 1..60 tokens; greedy and seeded sampled requests; max_tokens small enough that
    k shrinks near the end of many requests."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(5, 300) for _ in range(rng.randrange(1, 60))] for _ in range(12)]
    params = [SamplingParams(temperature=0.0 if i % 3 == 0 else 0.8, top_p=0.9 if i % 2 else 1.0,
                             top_k=20 if i % 4 == 1 else 0, seed=100 + i,
                             max_tokens=rng.randrange(3, 22), ignore_eos=True)
              for i in range(12)]
    return prompts, params


def _count_runs(llm) -> list[int]:
    loop = llm.core.runner.draft_loop
    calls = [0]
    run = loop.run

    def counted(rows):
        calls[0] += 1
        return run(rows)

    loop.run = counted
    return calls


@pytest.mark.parametrize("draft_sample_method", ["sample", "greedy"])
def test_the_device_program_proposes_exactly_what_the_host_passes_do(pair, make_llm,
                                                                     draft_sample_method):
    prompts, params = _workload(seed=3)
    kwargs = dict(draft_model=pair[1], num_speculative_tokens=4, max_num_batched_tokens=24,
                  num_kv_blocks=64, draft_sample_method=draft_sample_method)
    on_device = make_llm(pair[0], **kwargs)
    calls = _count_runs(on_device)
    a = on_device.generate(prompts, params)
    host = make_llm(pair[0], **kwargs)
    host.core.runner.draft_loop = None          # every pass through the host path
    b = host.generate(prompts, params)
    assert calls[0] > 5, "the proposal program must have run"
    for x, y in zip(a, b):
        cx, cy = x.outputs[0], y.outputs[0]
        assert cx.token_ids == cy.token_ids
        assert cx.spec_decode == cy.spec_decode          # same drafts, same acceptance


def test_the_program_writes_draft_kv_only_where_a_request_drafts(pair, make_llm):
    prompts, params = _workload(seed=5)
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4, num_kv_blocks=64)
    runner = llm.core.runner
    loop, bs = runner.draft_loop, runner.block_size
    seen = {"short": 0, "runs": 0, "changed": 0}
    run = loop.run

    def checked(rows):
        before = [k.clone() for k, _ in runner.draft_kv]
        drafts, probs = run(rows)
        allowed = set()
        for row in rows:
            blocks = row.request.block_ids
            allowed |= {blocks[p // bs] * bs + p % bs for p in range(row.start, row.start + row.num_drafts + 1)}
            seen["short"] += row.num_drafts < loop.k
        for old, (new, _) in zip(before, runner.draft_kv):
            diff = (old != new).flatten(2).any(-1).flatten()              # [num_blocks * block_size]
            changed = set(torch.nonzero(diff).flatten().tolist())
            assert changed <= allowed, f"KV written outside the drafting positions: {sorted(changed - allowed)[:5]}"
            seen["changed"] += len(changed)
        for row, d, q in zip(rows, drafts, probs):
            assert len(d) == row.num_drafts and q.shape == (row.num_drafts, runner.vocab_size)
            assert torch.allclose(q.sum(-1), torch.ones(row.num_drafts), atol=1e-4)
            assert all(q[j, t] > 0 for j, t in enumerate(d)), "a draft outside its own distribution"
        seen["runs"] += 1
        return drafts, probs

    loop.run = checked
    llm.generate(prompts, params)
    assert seen["runs"] > 5 and seen["changed"] > 0
    assert seen["short"] > 0, "some proposals must take fewer than k drafts (padding passes)"
