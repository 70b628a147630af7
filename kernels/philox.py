"""Counter-based random numbers shared bit-for-bit by the torch and Triton samplers.

Every random number the samplers use is a pure function ``U(seed, position, stream, index)``
in the open interval (0, 1):

* ``seed``: the request's int64 seed; ``position``: the index of the generated token in the
  request's output (0 = first generated token); ``stream``: one of :data:`SAMPLE`,
  :data:`DRAFT`, :data:`ACCEPT`, :data:`RECOVER`; ``index``: the vocabulary index (0 for the
  accept draw; the inverse-CDF draw uses words 0 and 1 of counter 0, :func:`uniform52`).
* Key mix (defined here, once). With ``c = (4 * position + stream) mod 2**32``::

      k0 = lo32(seed) ^ (c * 0x9E3779B1 mod 2**32)
      k1 = hi32(seed) ^ (c * 0x85EBCA77 mod 2**32)

  Both multipliers are odd, so for a fixed seed the map ``c -> (k0, k1)`` is a bijection:
  two draws of one request never share a key while ``position < 2**30``.
* Generator: Philox4x32-10 exactly as Triton's ``tl.randint4x(key, counter)`` runs it, with the
  64-bit key ``(k1 << 32) | k0``. Index ``i`` uses output word ``i % 4`` of the counter
  ``(i // 4, 0, 0, 0)`` (int32 ``i // 4``): one Philox call yields four consecutive indices, so
  a vocabulary of V entries costs V / 4 calls. Index 0 (the accept draw) is word 0 of counter 0,
  which is also what ``tl.randint(key, 0)`` returns.
* Uniform: ``u = ((r >> 9) + 0.5) * 2**-23`` (all exact in fp32), so ``2**-24 <= u <= 1 - 2**-24``:
  strictly inside (0, 1), which keeps ``-log(u)`` finite and positive. (``tl.rand`` itself maps
  to [0, 1) and can return 0, so we do not use its float conversion.)
* The inverse-CDF draw (a recovery or a bonus token) needs finer steps than 2**-23: a token of
  probability below that would be hit with probability 0 or 2**-23, not its own. It takes
  :func:`uniform52`, 52 bits from words 0 and 1 of counter 0, in fp64.

This module is plain torch (uint32 arithmetic emulated in int64 without overflow) and is the
oracle for the Triton twin in :mod:`kernels.triton_sampling`.
"""

from __future__ import annotations

import torch

SAMPLE = 0   # target sampling: plain decoding, strict verification (its bonus token too)
DRAFT = 1    # the draft model's proposals
ACCEPT = 2   # the accept/reject draw of probabilistic verification (index 0)
RECOVER = 3  # probabilistic verification's last token: the replacement after a rejection or
             # the bonus token (uniform52: one number per position)


def draft_stream(method: str) -> int:
    """The stream a draft is raced with under verification ``method``. Strict verification emits
    the target's own sample (stream SAMPLE) at each position, whatever was drafted; a draft raced
    with the same random numbers is coupled to that sample and matches it far more often than an
    independent one (stream DRAFT), at no cost to exactness. Probabilistic verification needs
    the draft independent of its accept draw and recovery: DRAFT."""
    return SAMPLE if method == "strict" else DRAFT

MASK32 = 0xFFFFFFFF
KEY_MUL_LO = 0x9E3779B1
KEY_MUL_HI = 0x85EBCA77

# Philox4x32 constants, as in triton/language/random.py
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
PHILOX_ROUNDS = 10


def _mul32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of ``a * b`` for a constant ``a`` and ``b`` in [0, 2**32) (int64).

    The int64 product wraps modulo 2**64 (two's complement, as torch's CPU and CUDA integer
    multiplies do); its 64 bits are exactly those of the unsigned product, which is < 2**64.
    The Philox known-answer tests check this.
    """
    prod = b * a
    return (prod >> 32) & MASK32, prod & MASK32


def mix_key(seeds: torch.Tensor, positions: torch.Tensor,
            stream: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Philox key words (k0, k1), each int64 in [0, 2**32), for each (seed, position).

    ``stream`` is one stream for all rows or a per-row tensor."""
    seeds = seeds.to(torch.int64)
    c = (positions.to(torch.int64) * 4 + stream) & MASK32
    k0 = (seeds & MASK32) ^ _mul32(KEY_MUL_LO, c)[1]
    k1 = ((seeds >> 32) & MASK32) ^ _mul32(KEY_MUL_HI, c)[1]
    return k0, k1


def philox4x32(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
               k0: torch.Tensor, k1: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 (Salmon et al. 2011; Triton's round order): four output words (int64).

    All inputs broadcast against each other and hold values in [0, 2**32).
    """
    c0, c1, c2, c3 = torch.broadcast_tensors(*(t.to(torch.int64) for t in (c0, c1, c2, c3)))
    k0, k1 = k0.to(torch.int64), k1.to(torch.int64)   # stay small: broadcast inside the xor
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mul32(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul32(PHILOX_ROUND_A, c0)
        c0 = hi_b ^ c1 ^ k0
        c2 = hi_a ^ c3 ^ k1
        c1 = lo_b
        c3 = lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def philox_words(counter: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor) -> torch.Tensor:
    """The four Philox4x32-10 words for counters ``(counter, 0, 0, 0)``: ``tl.randint4x(key,
    counter)``, stacked on a new last dimension ([..., 4] int64)."""
    c0 = counter.to(torch.int64) & MASK32
    zero = torch.zeros((), dtype=torch.int64, device=c0.device)
    return torch.stack(philox4x32(c0, zero, zero, zero, k0, k1), dim=-1)


def index_bits(index: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor) -> torch.Tensor:
    """The 32 random bits of each vocabulary ``index``: word ``index % 4`` of counter
    ``index // 4``. index broadcasts against k0, k1."""
    idx = index.to(torch.int64)
    words = philox_words(idx >> 2, k0, k1)                          # [..., 4]
    return torch.gather(words, -1, (idx & 3).expand(words.shape[:-1]).unsqueeze(-1)).squeeze(-1)


def bits_to_uniform(r: torch.Tensor) -> torch.Tensor:
    """uint32 values (held in int64) -> fp32 in [2**-24, 1 - 2**-24], exactly."""
    return ((r >> 9).to(torch.float32) + 0.5) * (2.0 ** -23)


def uniform(seeds: torch.Tensor, positions: torch.Tensor, stream: int | torch.Tensor,
            index: torch.Tensor) -> torch.Tensor:
    """``U(seed, position, stream, index)`` for every row and index.

    seeds, positions (and a per-row stream): [N] int64; index: [M] (or [N, M]) integer.
    Returns [N, M] fp32.
    """
    k0, k1 = mix_key(seeds, positions, stream)                   # [N]
    idx = index.to(torch.int64)
    if idx.dim() == 1:
        idx = idx.unsqueeze(0)                                     # [1, M]
    r = index_bits(idx, k0.unsqueeze(1), k1.unsqueeze(1))         # [N, M]
    return bits_to_uniform(r)


def uniform52(seeds: torch.Tensor, positions: torch.Tensor, stream: int | torch.Tensor) -> torch.Tensor:
    """One fp64 uniform per row with 52 random bits: ``((w0 >> 6) * 2**26 + (w1 >> 6) + 0.5) *
    2**-52`` from words 0 and 1 of counter 0, in [2**-53, 1 - 2**-53] (exact in fp64). [N]."""
    k0, k1 = mix_key(seeds, positions, stream)
    words = philox_words(torch.zeros_like(k0), k0, k1)                # [N, 4]
    bits = (words[:, 0] >> 6) * (1 << 26) + (words[:, 1] >> 6)       # < 2**52
    return (bits.to(torch.float64) + 0.5) * (2.0 ** -52)


def uniform_prefix(seeds: torch.Tensor, positions: torch.Tensor, stream: int | torch.Tensor,
                   v: int) -> torch.Tensor:
    """``uniform(seeds, positions, stream, arange(v))`` ([N, v] fp32) at a quarter of the Philox
    work: each counter's four words are the four consecutive indices it serves."""
    k0, k1 = mix_key(seeds, positions, stream)                   # [N]
    counters = torch.arange((v + 3) // 4, device=k0.device)       # [ceil(v / 4)]
    words = philox_words(counters.unsqueeze(0), k0.unsqueeze(1), k1.unsqueeze(1))  # [N, v4, 4]
    return bits_to_uniform(words.flatten(1)[:, :v])


def neg_log_exponential(u: torch.Tensor) -> torch.Tensor:
    """``log(E)`` with ``E = -log(u)``: the race subtracts it from log-weights."""
    return torch.log(-torch.log(u))
