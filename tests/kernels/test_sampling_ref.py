"""The torch reference sampler on hand-made inputs whose answers are known.

Random numbers (Philox known answers, open interval, key mix), the filtered distribution,
sample_draft, and rejection_sample: greedy, certain accept (q == p), certain reject
(p(x) == 0), k == 0 == plain sampling, ragged batches == requests one at a time.
"""

from __future__ import annotations

import math

import pytest
import torch

from specserve.kernels import philox as P
from specserve.kernels import ref_sampling as R

try:
    from tests.kernels.test_sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors
except ImportError:  # rootdir-less runs of this directory
    from test_sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors

METHODS = ["probabilistic", "strict"]


# ---------------------------------------------------------------- random numbers

def test_philox_known_answers() -> None:
    """Random123's published Philox4x32-10 vectors (counter, key) -> four words."""
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    z, f = t(0), t(0xFFFFFFFF)
    assert [int(w) for w in P.philox4x32(z, z, z, z, z, z)] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    assert [int(w) for w in P.philox4x32(f, f, f, f, f, f)] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi = [t(v) for v in (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344, 0xA4093822, 0x299F31D0)]
    assert [int(w) for w in P.philox4x32(*pi)] == [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


def test_index_uses_word_index_mod_4_of_counter_index_div_4() -> None:
    """U's bits at index i: word i % 4 of Philox counter (i // 4, 0, 0, 0) (known answers at
    counter 0 with key 0), and the prefix form used by the races equals the indexed form."""
    z = torch.zeros(1, 1, dtype=torch.int64)
    assert P.index_bits(torch.arange(4).unsqueeze(0), z, z).tolist() == [
        [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]]
    k0, k1 = torch.tensor([[0x243F6A88]]), torch.tensor([[0x85A308D3]])
    zero = torch.tensor(0)
    words = torch.stack(P.philox4x32(torch.arange(5), zero, zero, zero, k0, k1), dim=-1)  # [1, 5, 4]
    idx = torch.tensor([[0, 1, 2, 3, 4, 7, 9, 14, 19]])
    assert torch.equal(P.index_bits(idx, k0, k1), words[0, idx[0] // 4, idx[0] % 4].unsqueeze(0))
    seeds, pos = torch.tensor([3, -9]), torch.tensor([0, 41])
    for v in (1, 6, 64, 257):
        assert torch.equal(P.uniform_prefix(seeds, pos, P.RECOVER, v),
                           P.uniform(seeds, pos, P.RECOVER, torch.arange(v)))
    # the accept draw (index 0) is word 0 of counter 0, as it was with tl.randint
    k0, k1 = P.mix_key(seeds, pos, P.ACCEPT)
    first = P.philox4x32(torch.zeros(2, dtype=torch.int64), zero, zero, zero, k0, k1)[0]
    assert torch.equal(P.uniform(seeds, pos, P.ACCEPT, torch.zeros(1)).squeeze(1),
                       P.bits_to_uniform(first))


def test_uniform_strictly_inside_unit_interval() -> None:
    ends = P.bits_to_uniform(torch.tensor([0, 0x1FF, 0xFFFFFFFF], dtype=torch.int64))
    assert ends[0] == ends[1] == 2.0 ** -24 and ends[2] == 1.0 - 2.0 ** -24
    seeds = torch.tensor([0, -1, 2**63 - 1, -(2**63), 12345], dtype=torch.int64)
    u = P.uniform(seeds, torch.arange(5) * 1000, P.SAMPLE, torch.arange(4000))    # [5, 4000]
    assert bool(((u > 0) & (u < 1)).all())
    assert torch.isfinite(P.neg_log_exponential(u)).all()
    # mean and variance of U(0, 1): 20k draws, 6-sigma bounds
    assert abs(u.double().mean().item() - 0.5) < 6 * math.sqrt(1 / 12 / u.numel())
    assert abs(u.double().var().item() - 1 / 12) < 0.004


def test_key_mix_distinct_per_seed() -> None:
    """For one seed, every (position, stream) pair gets its own Philox key."""
    pos = torch.arange(8192).repeat_interleave(4)
    for seed in (0, -7, 2**62 + 3):
        keys = set()
        for stream in range(4):
            k0, k1 = P.mix_key(torch.full((8192,), seed), torch.arange(8192), stream)
            keys.update(zip(k0.tolist(), k1.tolist()))
        assert len(keys) == pos.numel()


def test_streams_positions_seeds_give_different_numbers() -> None:
    idx = torch.arange(64)
    base = P.uniform(torch.tensor([5]), torch.tensor([3]), P.SAMPLE, idx)
    for s, p, st in ((6, 3, P.SAMPLE), (5, 4, P.SAMPLE), (5, 3, P.DRAFT), (5, 3, P.RECOVER)):
        other = P.uniform(torch.tensor([s]), torch.tensor([p]), st, idx)
        assert (other != base).float().mean() > 0.95
    again = P.uniform(torch.tensor([5]), torch.tensor([3]), P.SAMPLE, idx)
    assert torch.equal(again, base)


# ---------------------------------------------------------------- distribution

def _probs1(logits: list[float], t=1.0, k=0, p=1.0, m=0.0) -> torch.Tensor:
    z = torch.tensor([logits], dtype=torch.float32)
    return R.probs(z, *param_tensors([(t, k, p, m)]))[0]


def test_probs_filters_by_hand() -> None:
    ln = [math.log(v) for v in (0.4, 0.3, 0.2, 0.1)]
    torch.testing.assert_close(_probs1(ln), torch.tensor([0.4, 0.3, 0.2, 0.1]))
    torch.testing.assert_close(_probs1(ln, k=2), torch.tensor([4 / 7, 3 / 7, 0, 0]))
    # top-p 0.65: 0.4 alone is short, 0.4 + 0.3 reaches it
    torch.testing.assert_close(_probs1(ln, p=0.65), torch.tensor([4 / 7, 3 / 7, 0, 0]))
    torch.testing.assert_close(_probs1(ln, p=0.7 + 1e-4), torch.tensor([4, 3, 2, 0]) / 9)
    # min-p 0.5: keep p >= 0.2
    torch.testing.assert_close(_probs1(ln, m=0.5), torch.tensor([4, 3, 2, 0]) / 9)
    # top-k then top-p on the renormalised survivors: top-3 -> (4, 3, 2)/9; 0.5 needs 4/9 + 3/9
    torch.testing.assert_close(_probs1(ln, k=3, p=0.5), torch.tensor([4 / 7, 3 / 7, 0, 0]))
    # temperature 0.5 squares and renormalises
    torch.testing.assert_close(_probs1(ln, t=0.5), torch.tensor([16, 9, 4, 1]) / 30.0)
    # ties are kept by top-k and top-p
    assert (_probs1([1.0, 1.0, 1.0, 0.0], k=2) > 0).tolist() == [True, True, True, False]
    assert (_probs1([1.0, 1.0, 1.0, 0.0], p=0.1) > 0).tolist() == [True, True, True, False]
    # top-k >= V and top-k <= 0 are off
    assert bool((_probs1(ln, k=4) > 0).all()) and bool((_probs1(ln, k=-1) > 0).all())


def test_greedy_is_argmax_lowest_index_on_ties() -> None:
    z = torch.tensor([[0.0, 3.0, 3.0, 1.0], [float("-inf"), -1.0, -2.0, -1.0]])
    assert R.greedy_argmax(z).tolist() == [1, 1]
    q = R.probs(z, *param_tensors([GREEDY, GREEDY]))
    assert q.tolist() == [[0, 1, 0, 0], [0, 1, 0, 0]]


# ---------------------------------------------------------------- sample_draft

def test_sample_draft_greedy_rows_and_stored_q() -> None:
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(5, 40, generator=gen) * 2
    params = [GREEDY] + list(PARAM_SETS.values())[:4]
    args = (*param_tensors(params), torch.arange(5) + 11, torch.arange(5))
    tok, q = R.sample_draft(z, *args, store_probs=True)
    tok2, none = R.sample_draft(z, *args, store_probs=False)
    assert none is None and torch.equal(tok, tok2)
    assert tok[0] == z[0].argmax() and q[0, tok[0]] == 1 and q[0].sum() == 1
    torch.testing.assert_close(q.sum(1), torch.ones(5))
    assert bool((q[torch.arange(5), tok] > 0).all())                   # token in the support
    assert torch.equal(q[1:], R.probs(z[1:], *param_tensors(params[1:])))
    assert bool((q[2] > 0).sum() == 4)                                 # top-k 4


def test_sample_draft_is_a_race_on_the_draft_stream() -> None:
    z = torch.randn(3, 30, generator=torch.Generator().manual_seed(1))
    seeds, pos = torch.tensor([1, 2, 3]), torch.tensor([0, 4, 9])
    tok, _ = R.sample_draft(z, *param_tensors([PARAM_SETS["t1"]] * 3), seeds, pos, False)
    u = P.uniform(seeds, pos, P.DRAFT, torch.arange(30))
    assert torch.equal(tok, torch.argmax(z - torch.log(-torch.log(u)), dim=1))


# ---------------------------------------------------------------- rejection_sample

def _out(case, method: str) -> torch.Tensor:
    return R.rejection_sample(*case.args(method))


@pytest.mark.parametrize("method", METHODS)
def test_greedy_requests_accept_while_argmax_matches(method: str) -> None:
    v = 8
    rows = torch.full((4, v), -5.0)
    for r, a in enumerate([2, 5, 1, 7]):                  # argmax of each row
        rows[r, a] = 3.0
    cu = torch.tensor([0, 3], dtype=torch.int32)
    base = (rows, cu)
    rest = (*param_tensors([GREEDY]), torch.tensor([9]), torch.tensor([0]), method)
    out = R.rejection_sample(*base, torch.tensor([2, 5, 0]), None, *rest)
    assert out.tolist() == [[2, 5, 1, -1]]                 # third draft wrong -> argmax of row 2
    out = R.rejection_sample(*base, torch.tensor([2, 5, 1]), None, *rest)
    assert out.tolist() == [[2, 5, 1, 7]]                  # all accepted -> bonus argmax
    out = R.rejection_sample(*base, torch.tensor([0, 5, 1]), None, *rest)
    assert out.tolist() == [[2, -1, -1, -1]]


def test_certain_accept_when_q_equals_p() -> None:
    """q == p: U * q(x) < p(x) holds for every U < 1, so every draft is accepted."""
    k, n, v = 3, 64, 20
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(k + 1, v, generator=gen)
    params = PARAM_SETS["t0.8_all"]
    p = R.probs(z, *param_tensors([params] * (k + 1)))
    seeds = torch.arange(n)
    drafts = torch.multinomial(p[:k], n, replacement=True, generator=gen).T.reshape(-1)
    out = R.rejection_sample(z.repeat(n, 1), torch.arange(n + 1, dtype=torch.int32) * k, drafts,
                             p[:k].repeat(n, 1), *param_tensors([params] * n), seeds,
                             torch.zeros(n, dtype=torch.int64), "probabilistic")
    assert torch.equal(out[:, :k], drafts.view(n, k))
    keep = torch.where(p[k] > 0, z[k] / params[0], float("-inf")).repeat(n, 1)
    bonus = R.race(keep, seeds, torch.full((n,), k), P.SAMPLE)
    assert torch.equal(out[:, k], bonus)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("how", ["logit_-inf", "top_k"])
def test_certain_reject_when_target_prob_is_zero(method: str, how: str) -> None:
    n, v = 32, 16
    z = torch.randn(3, v, generator=torch.Generator().manual_seed(4))
    x = int(z[0].argmin())
    params = (1.0, 0, 1.0, 0.0)
    if how == "logit_-inf":
        z[0, x] = float("-inf")
    else:
        params = (1.0, 3, 1.0, 0.0)                        # x is the least likely: outside top-3
    q = torch.zeros(2 * n, v)
    q[:, x] = 1.0
    drafts = torch.full((2 * n,), x)
    out = R.rejection_sample(z.repeat(n, 1), torch.arange(n + 1, dtype=torch.int32) * 2, drafts,
                             q, *param_tensors([params] * n), torch.arange(n),
                             torch.zeros(n, dtype=torch.int64), method)
    assert bool((out[:, 0] != x).all()) and bool((out[:, 1:] == -1).all())


@pytest.mark.parametrize("name", list(PARAM_SETS))
def test_k_zero_is_plain_sampling_for_every_method(name: str) -> None:
    n, v = 16, 50
    z = torch.randn(n, v, generator=torch.Generator().manual_seed(5)) * 2
    params = param_tensors([PARAM_SETS[name]] * n)
    seeds, pos = torch.arange(n) * 31, torch.arange(n) * 3
    d = R.row_distribution(z, *params)
    want = R.race(torch.where(d.keep, d.x, float("-inf")), seeds, pos, P.SAMPLE)
    cu = torch.zeros(n + 1, dtype=torch.int32)
    for method in METHODS:
        for q in (None, torch.zeros(0, v)):
            out = R.rejection_sample(z, cu, torch.zeros(0, dtype=torch.int64), q, *params,
                                     seeds, pos, method)
            assert out.shape == (n, 1) and torch.equal(out[:, 0], want)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("one_hot", [False, True])
def test_ragged_batch_equals_requests_one_at_a_time(method: str, one_hot: bool) -> None:
    ks = [0, 3, 1, 4, 2]
    params = [PARAM_SETS["t1"], GREEDY, PARAM_SETS["t0.6_topk4"], PARAM_SETS["t0.8_all"],
              PARAM_SETS["t1.4_topp0.8"]]
    case = make_verify_case(ks, params, vocab=64, seed=6, noise=0.3, one_hot=one_hot)
    out = _out(case, method)
    assert out.shape == (5, 5)
    for b, k in enumerate(ks):
        c0, r0 = int(case.cu[b]), int(case.cu[b]) + b
        one = R.rejection_sample(
            case.target_logits[r0:r0 + k + 1], torch.tensor([0, k], dtype=torch.int32),
            case.drafts[c0:c0 + k], None if case.q is None else case.q[c0:c0 + k],
            *(t[b:b + 1] for t in (case.temperature, case.top_k, case.top_p, case.min_p,
                                   case.seeds, case.positions)), method)
        n_tok = int((one[0] >= 0).sum())
        assert torch.equal(out[b, :k + 1], one[0]), (b, out[b], one[0])
        assert bool((out[b, n_tok:] == -1).all())
        assert torch.equal(out[b, :n_tok - 1], case.drafts[c0:c0 + n_tok - 1])


def test_noisy_drafts_are_partly_accepted() -> None:
    """Sanity of the case builder: close drafts get accepted, so the tests above bite."""
    case = make_verify_case([4] * 16, [PARAM_SETS["t1"]] * 16, vocab=64, seed=7, noise=0.3)
    n_acc = (_out(case, "probabilistic") >= 0).sum(1) - 1
    assert 0 < float(n_acc.float().mean()) < 4


def test_zero_draft_probability_raises() -> None:
    case = make_verify_case([2], [PARAM_SETS["t1"]], vocab=16, seed=8)
    case.q[0, case.drafts[0]] = 0.0
    with pytest.raises(ValueError, match="draft probability 0"):
        _out(case, "probabilistic")


def test_seeds_make_runs_repeatable() -> None:
    case = make_verify_case([3] * 8, [PARAM_SETS["t1.4_topp0.8"]] * 8, vocab=32, seed=9)
    a = _out(case, "probabilistic")
    assert torch.equal(a, _out(case, "probabilistic"))
    case.seeds = case.seeds + 1
    assert not torch.equal(a, _out(case, "probabilistic"))


def test_output_width_override_and_bad_method() -> None:
    case = make_verify_case([1, 2], [PARAM_SETS["t1"]] * 2, vocab=16, seed=10)
    out = R.rejection_sample(*case.args("strict"), max_num_draft_tokens=5)
    assert out.shape == (2, 6) and bool((out[:, 3:] == -1).all())
    with pytest.raises(ValueError):
        _out(case, "typical")
