"""The draft's proposal program (engine/runner/draft_loop.py) against the pass-by-pass host path.

On the CPU the program runs eagerly, padded to the same batch buckets as its CUDA graphs, so
these tests check what the GPU replays: the same drafts, probabilities and outputs as the host
path, and KV written only where a request drafts.
"""

from __future__ import annotations

import random

import pytest

from specserve.engine import SamplingParams
from specserve.engine.runner.drafter import Drafter
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


def _count_launches(llm) -> dict:
    """Counts of the program's two entry points: ``run`` (after the host read of the sampled
    tokens) and ``launch_chained`` (behind the verification, one read for both)."""
    loop = llm.core.runner.draft_loop
    calls = {"run": 0, "launch_chained": 0}
    for name in calls:
        original = getattr(loop, name)

        def counted(*args, _name=name, _original=original):
            calls[_name] += 1
            return _original(*args)

        setattr(loop, name, counted)
    return calls


@pytest.mark.parametrize("draft_sample_method", ["sample", "greedy"])
def test_the_device_program_proposes_exactly_what_the_host_passes_do(pair, make_llm, monkeypatch,
                                                                     draft_sample_method):
    """Three ways to propose: chained to the verification (one read a step), the program
    after the read of the sampled tokens, and pass by pass on the host. Same drafts, so the
    same tokens and acceptance, in a batch with chunked prefill and k shrinking near max_tokens."""
    prompts, params = _workload(seed=3)
    kwargs = dict(draft_model=pair[1], num_speculative_tokens=4, max_num_batched_tokens=24,
                  num_kv_blocks=64, draft_sample_method=draft_sample_method)
    chained = make_llm(pair[0], **kwargs)
    chained_calls = _count_launches(chained)
    a = chained.generate(prompts, params)
    with monkeypatch.context() as m:
        m.setattr(Drafter, "can_chain", lambda self, sampling: False)
        after_read = make_llm(pair[0], **kwargs)
        after_read_calls = _count_launches(after_read)
        b = after_read.generate(prompts, params)
    host = make_llm(pair[0], **kwargs)
    host.core.runner.speculator.drafter.loop = None   # every pass through the host path
    c = host.generate(prompts, params)
    assert chained_calls["launch_chained"] > 5, chained_calls
    assert after_read_calls["run"] > 5 and after_read_calls["launch_chained"] == 0, after_read_calls
    for x, y, z in zip(a, b, c):
        cx, cy, cz = x.outputs[0], y.outputs[0], z.outputs[0]
        assert cx.token_ids == cy.token_ids == cz.token_ids
        assert cx.spec_decode == cy.spec_decode == cz.spec_decode   # same drafts, same acceptance


@pytest.mark.parametrize("chained", [True, False])
def test_the_program_writes_draft_kv_only_where_a_request_drafts(pair, make_llm, monkeypatch,
                                                                 chained):
    if not chained:
        monkeypatch.setattr(Drafter, "can_chain", lambda self, sampling: False)
    prompts, params = _workload(seed=5)
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4, num_kv_blocks=64)
    runner = llm.core.runner
    loop, bs = runner.draft_loop, runner.block_size
    seen = {"short": 0, "runs": 0, "changed": 0}

    def check_kv(before, spans):
        """Draft KV changed only at positions start..start+num_drafts of each (request, start,
        num_drafts) in ``spans``."""
        allowed = set()
        for req, start, num_drafts in spans:
            if num_drafts:
                allowed |= {req.block_ids[p // bs] * bs + p % bs
                            for p in range(start, start + num_drafts + 1)}
            seen["short"] += num_drafts < loop.k_max
        for old, (new, _) in zip(before, runner.draft_kv):
            diff = (old != new).flatten(2).any(-1).flatten()              # [num_blocks * block_size]
            changed = set(torch.nonzero(diff).flatten().tolist())
            assert changed <= allowed, f"KV written outside the drafting positions: {sorted(changed - allowed)[:5]}"
            seen["changed"] += len(changed)
        seen["runs"] += 1

    run, launch_chained = loop.run, loop.launch_chained

    def checked_run(rows):
        before = [k.clone() for k, _ in runner.draft_kv]
        drafts, probs = run(rows)
        check_kv(before, [(r.request, r.start, r.k) for r in rows])
        for row, d, q in zip(rows, drafts, probs):
            assert len(d) == row.k and q.shape == (row.k, runner.vocab_size)
            assert torch.allclose(q.sum(-1), torch.ones(row.k), atol=1e-4)
            assert all(q[j, t] > 0 for j, t in enumerate(d)), "a draft outside its own distribution"
        return drafts, probs

    def checked_launch(requests, verified, max_model_len, caps):
        before = [k.clone() for k, _ in runner.draft_kv]
        launch_chained(requests, verified, max_model_len, caps)
        new = (verified >= 0).sum(1).tolist()
        check_kv(before, [(r, r.num_tokens + n - 2, max(0, min(loop.k_max, cap, r.draft_room(max_model_len) - n)))
                          for r, n, cap in zip(requests, new, caps)])

    loop.run, loop.launch_chained = checked_run, checked_launch
    llm.generate(prompts, params)
    assert seen["runs"] > 5 and seen["changed"] > 0
    assert seen["short"] > 0, "some proposals must take fewer than k drafts (padding passes)"


def test_passes_no_request_needs_are_skipped(pair, make_llm):
    """Near max_tokens every request takes fewer than k drafts; the program stops at the
    largest count any row takes (and a step where none may draft launches nothing)."""
    llm = make_llm(pair[0], draft_model=pair[0], num_speculative_tokens=4)   # self-draft
    loop = llm.core.runner.draft_loop
    passes, needed = [], []
    original_pass, original_launch = loop._pass, loop._launch

    def counted_pass(b, j):
        passes[-1] = max(passes[-1], j + 1)
        return original_pass(b, j)

    def counted_launch(b, num_drafts):
        passes.append(1 if num_drafts > 0 else 0)
        needed.append(num_drafts)
        return original_launch(b, num_drafts)

    loop._pass, loop._launch = counted_pass, counted_launch
    out = llm.generate([[5, 6, 7], [8, 9]], SamplingParams(temperature=0, max_tokens=9, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 9 for o in out)
    assert passes == [max(0, min(4, n)) for n in needed], (passes, needed)
    assert 0 < min(needed) < 4, needed            # short proposals happened


def test_draft_probs_are_views_of_one_copy_and_a_preempted_request_gets_its_own(pair, make_llm):
    """``collect`` copies the batch's probabilities once and hands each row a view (one copy per
    row when most rows are short): the next run overwrites the loop's buffer, not them. A
    preempted request copies its view, so a request waiting in the queue does not keep the whole
    batch's copy alive; ``draft_prob_bytes`` counts a shared copy once."""
    llm = make_llm(pair[0], draft_model=pair[1], num_speculative_tokens=4, num_kv_blocks=64,
                   draft_sample_method="sample")
    loop = llm.core.runner.draft_loop
    loop.probs.uniform_()
    before = loop.probs.clone()
    _, probs = loop.collect([[1, 2, 3, 4]] * 3, [4, 0, 2])
    assert probs[1] is None
    assert probs[0].untyped_storage().data_ptr() == probs[2].untyped_storage().data_ptr()
    assert probs[0].untyped_storage().data_ptr() != loop.probs.untyped_storage().data_ptr()
    loop.probs.fill_(7.0)
    assert torch.equal(probs[0], before[:4, 0]) and torch.equal(probs[2], before[:2, 2])
    loop.probs.copy_(before)
    _, short = loop.collect([[1, 2, 3, 4]] * 4, [4, 0, 0, 1])   # mostly short rows: one copy each
    assert short[0].untyped_storage().data_ptr() != short[3].untyped_storage().data_ptr()
    assert torch.equal(short[0], before[:4, 0]) and torch.equal(short[3], before[:1, 3])
    assert short[3].untyped_storage().nbytes() == short[3].numel() * short[3].element_size()

    core = llm.core
    for i in range(3):
        core.add_request(f"r{i}", [5 + i, 6, 7, 8], SamplingParams(temperature=1.0, max_tokens=40,
                                                                    ignore_eos=True, seed=i))
    running = core.scheduler.running
    while len(running) < 3 or not all(r.draft_probs is not None for r in running):
        core.step()
    req, other = core.scheduler.running[0], core.scheduler.running[1]
    assert req.draft_probs.untyped_storage().data_ptr() == other.draft_probs.untyped_storage().data_ptr()
    shared = req.draft_probs.untyped_storage().nbytes()
    assert core.draft_prob_bytes() == shared           # three views of one copy: counted once
    kept = req.draft_probs.clone()
    core.scheduler._preempt(req)
    assert req.draft_probs.untyped_storage().data_ptr() != other.draft_probs.untyped_storage().data_ptr()
    assert torch.equal(req.draft_probs, kept)
    assert core.draft_prob_bytes() == shared + kept.numel() * kept.element_size()
    core.abort(["r0", "r1", "r2"])
