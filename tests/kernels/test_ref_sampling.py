"""The torch reference sampler (kernels/ref_sampling.py) on hand-made inputs whose answers are known.

The filtered distribution, sample_draft, and rejection_sample: greedy, certain accept (q == p),
certain reject (p(x) == 0), k == 0 == plain sampling, ragged batches == requests one at a time.
Its random numbers (kernels/philox.py) are tested in test_philox.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from specserve.kernels import philox as P
from specserve.kernels import ref_sampling as R

try:
    from tests.kernels.sampling_cases import (GREEDY, PARAM_SETS, chi2_pvalue, make_verify_case,
                                              param_tensors)
except ImportError:  # rootdir-less runs of this directory
    from sampling_cases import GREEDY, PARAM_SETS, chi2_pvalue, make_verify_case, param_tensors

METHODS = ["probabilistic", "strict"]


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


def test_a_draft_on_the_sample_stream_is_the_targets_own_sample_when_q_equals_p() -> None:
    """Strict verification races drafts with stream SAMPLE (philox.draft_stream): a draft from
    the target's own distribution is then exactly the target's sample at that position, which
    k = 0 (plain sampling) draws; on the DRAFT stream it agrees only by chance."""
    gen = torch.Generator().manual_seed(4)
    n, v = 64, 50
    z = torch.randn(n, v, generator=gen) * 1.5
    params = param_tensors([PARAM_SETS["t1"]] * (n // 2) + [PARAM_SETS["t0.6_topk4"]] * (n // 2))
    seeds, pos = torch.arange(n) * 31 + 7, torch.arange(n) * 5
    assert P.draft_stream("strict") == P.SAMPLE and P.draft_stream("probabilistic") == P.DRAFT
    coupled, _ = R.sample_draft(z, *params, seeds, pos, False, stream=P.SAMPLE)
    independent, _ = R.sample_draft(z, *params, seeds, pos, False)
    plain = R.rejection_sample(z, torch.zeros(n + 1, dtype=torch.int32), torch.zeros(0, dtype=torch.long),
                               None, *params, seeds, pos, "strict")[:, 0]
    assert torch.equal(coupled, plain)
    assert int((independent == plain).sum()) < n - 10


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
    # the bonus token: the inverse CDF of the bonus row's p with uniform52(RECOVER) at position k
    w = R.row_distribution(z[k:], *param_tensors([params])).weights.repeat(n, 1)
    bonus = R.inverse_cdf(w, P.uniform52(seeds, torch.full((n,), k), P.RECOVER))
    assert torch.equal(out[:, k], bonus) and len(set(bonus.tolist())) > 3


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


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("one_hot", [False, True])
def test_all_greedy_shortcut_equals_the_general_path(method: str, one_hot: bool) -> None:
    """An all-greedy batch skips the random streams and the filtered softmax (all_greedy); the
    same greedy requests beside one sampled request take the general path: equal outputs."""
    ks = [3, 0, 4, 2, 1]
    case = make_verify_case(ks + [2], [GREEDY] * len(ks) + [PARAM_SETS["t1"]], vocab=64, seed=8,
                            noise=0.4, one_hot=one_hot)
    # request 1 verifies nothing; its one row's argmax is the next draft in the flat list,
    # which a shortcut that forgot the bonus rows would accept
    case.target_logits[4, case.drafts[3]] = 100.0
    general = _out(case, method)
    n_rows, n_drafts = sum(ks) + len(ks), sum(ks)
    greedy_only = R.rejection_sample(
        case.target_logits[:n_rows], case.cu[:len(ks) + 1], case.drafts[:n_drafts],
        None if case.q is None else case.q[:n_drafts],
        *(t[:len(ks)] for t in (case.temperature, case.top_k, case.top_p, case.min_p,
                                case.seeds, case.positions)), method, max_num_draft_tokens=4)
    assert R.all_greedy(case.temperature[:len(ks)]) and not R.all_greedy(case.temperature)
    assert torch.equal(greedy_only, general[:len(ks)])
    assert 0 < int((greedy_only[:, :-1] >= 0).sum()) - len(ks) < sum(ks)  # some drafts accepted, not all

    z = case.target_logits.float()
    mixed = param_tensors([GREEDY] * len(ks) + [PARAM_SETS["t1"]])
    args = (torch.arange(len(ks) + 1) + 3, torch.arange(len(ks) + 1))
    tok, q = R.sample_draft(z[:len(ks) + 1], *mixed, *args, store_probs=True)
    tok_g, q_g = R.sample_draft(z[:len(ks)], *(t[:len(ks)] for t in mixed),
                                *(a[:len(ks)] for a in args), store_probs=True)
    assert torch.equal(tok_g, tok[:len(ks)]) and torch.equal(q_g, q[:len(ks)])


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


# ---------------------------------------------------------------- recovery: inverse CDF

def test_inverse_cdf_over_several_tiles_follows_the_weights() -> None:
    """Rows wider than a tile, with whole tiles and runs of zero weight: the two-level search
    picks each entry with probability w / sum(w) (chi-square over 30,000 draws, p > 1e-3) and
    never an entry of weight 0, whatever u is."""
    v = 3 * R.RECOVER_TILE + 100
    gen = torch.Generator().manual_seed(5)
    w = torch.rand(v, generator=gen) ** 3
    w[R.RECOVER_TILE: 2 * R.RECOVER_TILE + 37] = 0.0          # a whole tile and a bit more
    w[::7] = 0.0
    n = 30_000
    u = P.bits_to_uniform(torch.randint(0, 2**32, (n,), generator=gen))
    idx = R.inverse_cdf(w.expand(n, v), u)
    counts = torch.bincount(idx, minlength=v)
    assert counts[w == 0].sum() == 0
    assert chi2_pvalue(counts, w) > 1e-3
    edges = torch.tensor([2.0 ** -24, 0.5, 1 - 2.0 ** -24])
    got = R.inverse_cdf(w.expand(3, v), edges)
    last = int(torch.nonzero(w).max())
    assert bool((w[got] > 0).all()) and int(got[2]) == last and int(got[0]) == int(torch.nonzero(w).min())


def test_inverse_cdf_resolves_tokens_far_below_a_23_bit_step() -> None:
    """Tail tokens of probability ~1e-7 each (below 2**-23 ~ 1.2e-7) right after one heavy token
    in the same tile: a u at the middle of each tail token's interval (exact fp64 arithmetic)
    draws that token, for every one of them. With fp32 running totals (the search before
    dac7aeb) 1 + 1e-7 rounds to a multiple of fp32's step of 1.2e-7 at 1.0, and most tail
    tokens are skipped or swapped (checked below against that search, written out here); a
    23-bit u also has too few values to land in every such interval. uniform52's u has 52
    bits."""
    tail = 1500
    heavy = R.RECOVER_TILE - 300                                 # tail tokens share its tile
    v = heavy + 1 + tail
    w = torch.zeros(v)
    w[heavy] = 1.0
    w[heavy + 1:] = 1e-7
    w64 = w.double()
    start = torch.cumsum(w64, 0) - w64                           # exact interval starts
    idx = torch.arange(heavy + 1, v)
    u = (start[idx] + w64[idx] / 2) / float(w64.sum())
    assert torch.equal(R.inverse_cdf(w.expand(tail, v), u), idx)
    assert int((_fp32_inverse_cdf(w.expand(tail, v), u) != idx).sum()) > tail // 2
    u52 = P.uniform52(torch.arange(4000), torch.zeros(4000, dtype=torch.int64), P.RECOVER)
    bits = u52 * 2.0 ** 52 - 0.5
    assert torch.equal(bits, bits.round()) and bool(((bits % 2 ** 29) != 0).any())
    assert 0 < float(u52.min()) and float(u52.max()) < 1


def _fp32_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The two-level search as it was before dac7aeb: fp32 tile sums and running totals."""
    n, v = weights.shape
    tile = R.RECOVER_TILE
    nt = -(-v // tile)
    tiles = torch.nn.functional.pad(weights, (0, nt * tile - v)).view(n, nt, tile)
    sums = tiles.sum(dim=2)
    target = u.float() * sums.sum(dim=1)
    cum = sums.cumsum(dim=1)
    t = R._tile_of(sums, cum, target)
    before = torch.where(t > 0, cum.gather(1, (t - 1).clamp(min=0).unsqueeze(1)).squeeze(1), 0.0)
    row = tiles[torch.arange(n), t]
    hit = (row.cumsum(dim=1) > (target - before).unsqueeze(1)) & (row > 0)
    return t * tile + R._first_or_last_positive(hit, row)


def test_recovery_of_an_all_zero_residual_falls_back_to_p() -> None:
    w = torch.tensor([[0.0, 2.0, 0.0, 1.0]])
    for u, want in ((0.1, 1), (0.9, 3)):
        got = R.recover(w, torch.zeros_like(w), torch.tensor([u]))
        assert int(got) == want
    assert int(R.recover(w, torch.tensor([[0.0, 0.0, 5.0, 0.0]]), torch.tensor([0.9]))) == 2


def test_a_zero_tile_is_never_chosen_even_if_a_scan_dips_below_the_total_before_it() -> None:
    """A parallel scan can leave a zero tile's running total an ulp below the total before it;
    counting the totals at or below the target then picks the zero tile (and its 'last positive
    entry' would be token 0). Choosing the first positive tile whose total passes the target
    does not."""
    sums = torch.tensor([[1.0, 0.0, 1.0]])
    cum = torch.tensor([[1.0, 1.0 - 2.0 ** -23, 2.0]])     # the scan's dip at the zero tile
    target = torch.tensor([1.0 - 2.0 ** -24])
    assert int((cum <= target).sum()) == 1                  # a count lands on the zero tile
    assert int(R._tile_of(sums, cum, target)) == 0
