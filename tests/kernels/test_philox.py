"""The torch Philox (kernels/philox.py): the random numbers every sampler draws, on known answers.

Random123's published Philox4x32-10 vectors, the word-index layout of the indexed and prefix
forms, the open unit interval, one key per (seed, position, stream). The Triton side is compared
with these bit for bit in test_triton_sampling.py (interpreter) and tests/gpu (device).
"""

from __future__ import annotations

import math

import torch

from specserve.kernels import philox as P


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
