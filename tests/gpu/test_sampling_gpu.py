"""Triton sampling kernels on a real GPU: bf16, V = 151,936, B up to 256, k up to 8.

Run on the GPU machine with ``pytest -m gpu tests/gpu/test_sampling_gpu.py``; skipped without CUDA.

Expectations against the torch reference running on the same GPU:
* random numbers bit-identical (integer Philox and exact float steps);
* greedy requests identical;
* sampled requests: identical tokens for at least 99% of requests. Triton's exp/log are the
  fast hardware approximations, torch's are not, so a token can flip where two candidates tie
  to ~1e-6 or a draw sits that close to an acceptance or top-p boundary; anything beyond a
  handful of flips is a bug;
* stored draft probabilities within 1e-5 absolute;
* chi-square / acceptance statistics of the Triton path (the checks of test_ref_sampling_stats);
* no host synchronisation: both functions are captured in a CUDA graph and replayed.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():
    pytest.skip("needs a CUDA device", allow_module_level=True)

from specserve.kernels import philox as P  # noqa: E402
from specserve.kernels import ref_sampling as R  # noqa: E402
from specserve.kernels import triton_sampling as TS  # noqa: E402

try:
    from tests.kernels.philox_probes import uniform52_kernel, uniform_kernel, uniform_tile_kernel
    from tests.kernels.sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors
    from tests.kernels.test_ref_sampling_stats import CASES, check_verification
except ImportError:  # rootdir-less runs
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.kernels.philox_probes import uniform52_kernel, uniform_kernel, uniform_tile_kernel
    from tests.kernels.sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors
    from tests.kernels.test_ref_sampling_stats import CASES, check_verification

DEV = "cuda"
VOCAB = 151_936
MIX = [GREEDY] + list(PARAM_SETS.values())          # 6 parameter sets, cycled over requests
MIN_AGREEMENT = 0.99


def _params(b: int) -> list[tuple]:
    return [MIX[i % len(MIX)] for i in range(b)]


def test_uniform_bit_identical_on_gpu() -> None:
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345], device=DEV)
    pos = torch.tensor([0, 7, 2**33, 5, 99], device=DEV)
    v = 5000
    out = torch.empty(5, 4, v, device=DEV)
    uniform_kernel[(5, 4)](seeds, pos, out, V=v, BLOCK_V=8192)
    for stream in range(4):
        assert torch.equal(out[:, stream], P.uniform(seeds, pos, stream, torch.arange(v, device=DEV)))


def test_uniform52_bit_identical_on_gpu() -> None:
    """The inverse-CDF draw's fp64 number (52 bits from two Philox words)."""
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345], device=DEV)
    pos = torch.tensor([0, 7, 2**33, 5, 99], device=DEV)
    out = torch.empty(5, 4, dtype=torch.float64, device=DEV)
    uniform52_kernel[(5, 4)](seeds, pos, out)
    for stream in range(4):
        assert torch.equal(out[:, stream], P.uniform52(seeds, pos, stream))


def test_uniform_tile_bit_identical_on_gpu() -> None:
    """The races' generator (four indices per Philox call, interleaved) with the kernels' tile."""
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345], device=DEV)
    pos = torch.tensor([0, 7, 2**33, 5, 99], device=DEV)
    v = 5000
    out = torch.empty(5, 4, v, device=DEV)
    uniform_tile_kernel[(5, 4)](seeds, pos, out, V=v, BLOCK=1024)
    for stream in range(4):
        assert torch.equal(out[:, stream], P.uniform_prefix(seeds, pos, stream, v))


@pytest.mark.parametrize("b", [1, 64, 256])
def test_sample_draft_bf16_full_vocab(b: int) -> None:
    gen = torch.Generator(device=DEV).manual_seed(b)
    z = (torch.randn(b, VOCAB, device=DEV, generator=gen) * 3).to(torch.bfloat16)
    args = (*(t.to(DEV) for t in param_tensors(_params(b))),
            torch.arange(b, device=DEV) * 7 + 1, torch.arange(b, device=DEV))
    tok, q = TS.sample_draft(z, *args, True)
    want_tok, want_q = R.sample_draft(z, *args, True)
    greedy = args[0] == 0
    assert torch.equal(tok[greedy], want_tok[greedy])
    assert (tok == want_tok).float().mean() >= MIN_AGREEMENT
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-3)
    torch.testing.assert_close(q.sum(1), torch.ones(b, device=DEV), atol=1e-4, rtol=0)


@pytest.mark.parametrize("b,k", [(1, 8), (8, 3), (64, 5), (256, 8)])
@pytest.mark.parametrize("method,one_hot", [("probabilistic", False), ("probabilistic", True),
                                            ("strict", False)])
def test_rejection_sample_bf16_full_vocab(b: int, k: int, method: str, one_hot: bool) -> None:
    ks = [(k - i % 3) if i % 5 else 0 for i in range(b)] if b > 1 else [k]
    ks = [max(0, x) for x in ks]
    case = make_verify_case(ks, _params(b), vocab=VOCAB, seed=b * 10 + k, dtype=torch.bfloat16,
                            noise=0.2, one_hot=one_hot, scale=3.0, device=DEV)
    got = TS.rejection_sample(*case.args(method))
    want = R.rejection_sample(*case.args(method))
    assert got.shape == want.shape == (b, max(ks) + 1)
    greedy = case.temperature == 0
    assert torch.equal(got[greedy], want[greedy])
    same = (got == want).all(dim=1).float().mean()
    assert same >= MIN_AGREEMENT, f"{same:.4f} of requests identical"
    n_tok = (got >= 0).sum(1)
    assert bool((n_tok >= 1).all()) and bool((n_tok <= torch.tensor(ks, device=DEV) + 1).all())


@pytest.mark.parametrize("variant,name", CASES)
def test_triton_verification_statistics(variant: str, name: str) -> None:
    check_verification(variant, PARAM_SETS[name], seed=200 + len(name),
                       sampler=TS.rejection_sample, n=100_000, device=DEV, vocab=40)


def test_cuda_graph_capture_without_host_sync() -> None:
    """Captured once, replayed on new inputs: equal to eager calls (no sync, no host reads)."""
    b, k = 32, 4
    case = make_verify_case([k] * b, _params(b), vocab=VOCAB, seed=5, dtype=torch.bfloat16,
                            noise=0.2, scale=3.0, device=DEV)
    case.cu = case.cu.to(DEV)
    draft_logits = case.target_logits[:b].clone()
    args = case.args("probabilistic")
    dargs = (case.temperature, case.top_k, case.top_p, case.min_p, case.seeds, case.positions)

    def step():
        tok, q = TS.sample_draft(draft_logits, *dargs, True)
        out = TS.rejection_sample(*args, max_num_draft_tokens=k)
        return tok, q, out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()                                           # compile and warm up
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for trial in range(2):
        case.seeds.add_(1000 + trial)
        draft_logits.mul_(1.1)
        graph.replay()
        eager = step()
        for s, e in zip(static, eager):
            assert torch.equal(s, e)


@pytest.mark.skipif(torch.cuda.get_device_capability()[0] < 9, reason="PDL needs compute capability 9.0")
@pytest.mark.parametrize("b,k", [(8, 3), (64, 5)])
def test_pdl_launches_give_the_same_tokens_over_graph_replays(b: int, k: int) -> None:
    """Tuning.pdl: each sampler kernel launched while the one before it runs gives, over CUDA
    graph replays whose logits a kernel inside the graph rewrites every time, the tokens and q
    of the same calls launched one after the other, bit for bit. A final race, finalize or
    draft finish that read before its wait would read the last replay's partials in some
    replay. (The row passes follow torch kernels, which release nothing early: their own wait
    is checked in the compiled PTX, tests/kernels/test_sampling_triton_kernels_compile.py.)"""
    from dataclasses import replace

    from specserve.kernels import triton_pdl

    case = make_verify_case([k - i % 2 for i in range(b)], _params(b), vocab=VOCAB, seed=b + k,
                            dtype=torch.bfloat16, noise=0.2, scale=3.0, device=DEV)
    case.cu = case.cu.to(DEV)
    base_target, base_draft = case.target_logits.clone(), case.target_logits[:b].clone()
    scale = torch.ones(1, device=DEV, dtype=torch.bfloat16)
    args = list(case.args("probabilistic"))
    dargs = (case.temperature, case.top_k, case.top_p, case.min_p, case.seeds, case.positions)
    verify = replace(TS.verification_tuning(case.target_logits.shape[0]), pdl=True)
    draft = replace(TS.DRAFT_TUNING, pdl=True)
    assert triton_pdl.usable(case.target_logits), "PDL is off here: the test would test nothing"

    def step(with_pdl: bool):
        target = base_target * scale           # written by a kernel inside the graph
        args[0] = target
        tok, q = TS.sample_draft(base_draft * scale, *dargs, True,
                                 tuning=draft if with_pdl else replace(draft, pdl=False))
        out = TS.rejection_sample(*args, max_num_draft_tokens=k,
                                  tuning=verify if with_pdl else replace(verify, pdl=False))
        return tok, q, out

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step(True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(True)
    for trial in range(6):
        scale.fill_(1.0 + 0.25 * trial)
        case.seeds.add_(7 + trial)
        graph.replay()
        plain = step(False)
        for s, p in zip(static, plain):
            assert torch.equal(s, p), f"replay {trial}: PDL launches differ from plain ones"


@pytest.mark.parametrize("b,k", [(8, 3), (64, 5), (256, 3)])
def test_prefetch_gives_the_same_tokens_and_q_bit_for_bit(b: int, k: int) -> None:
    """Tuning.prefetch only moves the row pass's loads a step ahead: at the real vocabulary in
    bf16, with every filter mix of _params, the verification's tokens and the draft sampler's
    tokens and q are the calls' without it, bit for bit (the CPU interpreter checks the same
    against the reference at a small vocabulary)."""
    from dataclasses import replace

    case = make_verify_case([k - i % 2 for i in range(b)], _params(b), vocab=VOCAB, seed=b + 3 * k,
                            dtype=torch.bfloat16, noise=0.2, scale=3.0, device=DEV)
    verify = TS.verification_tuning(case.target_logits.shape[0])
    outs = [TS.rejection_sample(*case.args("probabilistic"), max_num_draft_tokens=k,
                                tuning=replace(verify, prefetch=pf)) for pf in (False, True)]
    assert torch.equal(outs[0], outs[1]), "prefetch changed a verification token"
    dargs = (case.temperature, case.top_k, case.top_p, case.min_p, case.seeds, case.positions)
    draft = [TS.sample_draft(case.target_logits[:b], *dargs, True,
                             tuning=replace(TS.DRAFT_TUNING, prefetch=pf)) for pf in (False, True)]
    assert torch.equal(draft[0][0], draft[1][0]) and torch.equal(draft[0][1], draft[1][1])


@pytest.mark.parametrize("b,k", [(8, 3), (64, 3), (64, 5), (256, 8)])
def test_fused_race_gives_the_same_tokens_over_graph_replays(b: int, k: int, monkeypatch) -> None:
    """Tuning.fused_race: the row pass and the final race in one launch, each race program
    waiting on its request's count of finished row programs. Over CUDA graph replays whose
    logits a kernel inside the graph rewrites and whose seeds change (so the rejected rows
    move), its tokens are the separate kernels', bit for bit: a race program that passed its
    wait early, or read a partial through a stale L1 line, or a request finalized before its
    last race program was done, would read the last replay's values in some replay. Greedy,
    filtered and plain rows ride along. Every count is back at zero after each call."""
    from dataclasses import replace

    drafts = [k - i % 3 if i % 5 else 0 for i in range(b)]   # (every fifth: a plain row)
    case = make_verify_case(drafts, _params(b), vocab=VOCAB, seed=7 * b + k,
                            dtype=torch.bfloat16, noise=0.2, scale=3.0, device=DEV)
    case.cu = case.cu.to(DEV)
    base = case.target_logits.clone()
    scale = torch.ones(1, device=DEV, dtype=torch.bfloat16)
    args = list(case.args("probabilistic"))
    verify = TS.verification_tuning(base.shape[0])
    # (parallel accept tests: a fused race needs them; NARROW, below 32 rows, has them off)
    fused = replace(verify, fused_race=True, parallel_accept=True)
    apart = replace(fused, fused_race=False)

    def step(tuning):
        args[0] = base * scale                 # written by a kernel inside the graph
        return TS.rejection_sample(*args, max_num_draft_tokens=k, tuning=tuning)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        assert torch.equal(step(fused), step(apart))
    torch.cuda.current_stream().wait_stream(stream)
    counts = TS._race_counts(torch.device(DEV), b)
    assert counts is not None and int(counts.abs().sum()) == 0
    launched = []
    real = TS.K.verify_pass_kernel

    class _Counted:                            # the graph must hold the fused launch
        def __getitem__(self, grid):
            launched.append(grid)
            return real[grid]

    monkeypatch.setattr(TS.K, "verify_pass_kernel", _Counted())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step(fused)
    monkeypatch.undo()
    assert len(launched) == 1, "the captured graph holds the separate kernels, not the fused launch"
    accepted = 0
    for trial in range(12):
        scale.fill_(1.0 + 0.125 * trial)
        case.seeds.add_(11 + trial)
        graph.replay()
        want = step(apart)
        assert torch.equal(static, want), f"replay {trial}: the fused race differs"
        assert int(counts.abs().sum()) == 0, f"replay {trial}: counts left at {counts.nonzero()}"
        accepted += int((want[:, 1:] >= 0).sum())
    assert accepted > 0, "no draft was accepted: the accept tests' partials were not exercised"
