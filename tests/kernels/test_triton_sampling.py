"""The Triton sampling kernels under the CPU interpreter vs the torch reference.

TRITON_INTERPRET=1 must be set before Triton kernel modules are imported and must not leak into
the rest of the suite, so a plain ``pytest`` run collects only ``test_interpreter_suite``, which
runs this same file in a subprocess with the variable set; there the cases below are defined.

Expectations: random numbers bit-identical; tokens identical (both sides compute x = z / T with
IEEE division and the same race; exp/log may differ in the last ulp between numpy and torch, which
cannot flip a token unless two candidates tie to ~1e-7, not the case for these seeds; the
recovery's inverse CDF sums in a different order on each side, tiles of BLOCK here and of
1,024 in the reference, so a target within ~1e-7 of a boundary could differ, again not for
these seeds); stored q
within 1e-6 absolute and with the same zero pattern. fp32 and fp16 logits (bf16 is checked on the
GPU: the interpreter's bf16 is unreliable). Small shapes, vocabularies that are not a multiple of
the tile, several vocabulary chunks per row.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

INTERP = os.environ.get("TRITON_INTERPRET") == "1"
REPO = Path(__file__).resolve().parents[2]

if not INTERP:

    def test_interpreter_suite() -> None:
        pytest.importorskip("triton")
        env = dict(os.environ, TRITON_INTERPRET="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "-W", "ignore:divide by zero encountered in log:RuntimeWarning", __file__],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        tail = (proc.stdout + proc.stderr)[-6000:]
        assert proc.returncode == 0, f"interpreter tests failed:\n{tail}"
        assert " passed" in proc.stdout and "skipped" not in proc.stdout, tail
        print(proc.stdout.strip().splitlines()[-1])

else:
    import triton
    import triton.language as tl

    from specserve.kernels import philox as P
    from specserve.kernels import ref_sampling as R
    from specserve.kernels import triton_sampling as TS

    try:
        from tests.kernels.philox_probes import uniform52_kernel, uniform_kernel, uniform_tile_kernel
        from tests.kernels.sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors
    except ImportError:  # rootdir-less runs of this directory
        from philox_probes import uniform52_kernel, uniform_kernel, uniform_tile_kernel
        from sampling_cases import GREEDY, PARAM_SETS, make_verify_case, param_tensors

    BLOCK, CHUNK = 64, 128          # 3 chunks of 2 tiles for V = 300
    MIX = [GREEDY] + list(PARAM_SETS.values())

    def test_uniform_bit_identical() -> None:
        seeds = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), 2**62 + 12345, 987654321])
        pos = torch.tensor([0, 5, 7, 2**31 + 3, 1000, 2**40, 3])
        v = 200
        out = torch.empty(len(seeds), 4, v)
        uniform_kernel[(len(seeds), 4)](seeds, pos, out, V=v, BLOCK_V=256)
        for stream in range(4):
            want = P.uniform(seeds, pos, stream, torch.arange(v))
            assert torch.equal(out[:, stream], want), stream

    def test_uniform52_bit_identical() -> None:
        seeds = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), 2**62 + 12345, 987654321])
        pos = torch.tensor([0, 5, 7, 2**31 + 3, 1000, 2**40, 3])
        out = torch.empty(len(seeds), 4, dtype=torch.float64)
        uniform52_kernel[(len(seeds), 4)](seeds, pos, out)
        for stream in range(4):
            assert torch.equal(out[:, stream], P.uniform52(seeds, pos, stream)), stream

    @triton.jit
    def _words_kernel(key_ptr, out_ptr, N: tl.constexpr):
        row = tl.program_id(0)
        c = tl.arange(0, N)
        r0, r1, r2, r3 = tl.randint4x(tl.load(key_ptr + row).to(tl.uint64), c)
        base = out_ptr + row * 4 * N + c
        tl.store(base, r0.to(tl.int64))
        tl.store(base + N, r1.to(tl.int64))
        tl.store(base + 2 * N, r2.to(tl.int64))
        tl.store(base + 3 * N, r3.to(tl.int64))

    def test_philox_words_equal_triton_randint4x() -> None:
        """All four words of the torch Philox against Triton's own tl.randint4x."""
        k0 = [0, 1, 0xFFFFFFFF, 0x12345678, 0x9E3779B9]
        k1 = [0, 0, 0xFFFFFFFF, 0xDEADBEEF, 7]
        keys = [(hi << 32 | lo) - (1 << 64 if hi >> 31 else 0) for lo, hi in zip(k0, k1)]
        n = 64
        out = torch.empty(len(keys), 4, n, dtype=torch.int64)
        _words_kernel[(len(keys),)](torch.tensor(keys, dtype=torch.int64), out, N=n)
        want = P.philox_words(torch.arange(n).unsqueeze(0), torch.tensor(k0).unsqueeze(1),
                              torch.tensor(k1).unsqueeze(1))                   # [5, n, 4]
        assert torch.equal(out, want.permute(0, 2, 1))

    def test_uniform_tile_bit_identical() -> None:
        """The races' tile generator (one Philox call per 4 indices) is U, in order."""
        seeds = torch.tensor([0, -1, 2**63 - 1, 2**62 + 12345, 987654321])
        pos = torch.tensor([0, 7, 2**31 + 3, 2**40, 3])
        v = 300
        out = torch.empty(len(seeds), 4, v)
        uniform_tile_kernel[(len(seeds), 4)](seeds, pos, out, V=v, BLOCK=64)
        for stream in range(4):
            want = P.uniform(seeds, pos, stream, torch.arange(v))
            assert torch.equal(out[:, stream], want), stream
            assert torch.equal(P.uniform_prefix(seeds, pos, stream, v), want)

    @pytest.mark.parametrize("dtype,chunk,store,stream", [
        (torch.float32, CHUNK, True, P.DRAFT), (torch.float32, None, False, P.SAMPLE),
        (torch.float16, CHUNK, False, P.DRAFT), (torch.float16, None, True, P.SAMPLE)])
    def test_sample_draft_matches_reference(dtype, chunk, store, stream) -> None:
        gen = torch.Generator().manual_seed(11)
        z = (torch.randn(len(MIX), 300, generator=gen) * 2).to(dtype)
        z[:, 290:] = float("-inf")                                      # padded vocabulary
        args = (*param_tensors(MIX), torch.arange(len(MIX)) * 97 - 5, torch.arange(len(MIX)) + 3)
        tok, q = TS.sample_draft(z, *args, store, block=BLOCK, chunk=chunk, stream=stream)
        want_tok, want_q = R.sample_draft(z, *args, store, stream=stream)
        other, _ = R.sample_draft(z, *args, store, stream=P.DRAFT + P.SAMPLE - stream)
        assert torch.equal(tok, want_tok) and not torch.equal(tok, other)
        if store:
            assert torch.equal(q > 0, want_q > 0)
            torch.testing.assert_close(q, want_q, atol=1e-6, rtol=1e-5)
        else:
            assert q is None

    def test_parameter_rows_reach_the_kernels_16_byte_aligned() -> None:
        """Rows cut from one [3, B] tensor start unaligned for some B; Triton would compile a
        kernel variant per alignment pattern mid-traffic, so the sampler hands kernels aligned
        copies instead."""
        for b in range(1, 9):
            f = torch.rand(3, b)
            i = torch.arange(3 * b).reshape(3, b)
            params = TS._params(torch.device("cpu"), f[0], i[0], f[1], f[2], i[1], i[2])
            assert all(t.data_ptr() % 16 == 0 for t in params), b
            assert torch.equal(params[2], f[1]) and torch.equal(params[5], i[2])

    def test_sample_draft_writes_q_into_a_given_slab() -> None:
        """The draft program hands each pass a slab of its [k, B, V] buffer: both twins write q
        there and return it."""
        gen = torch.Generator().manual_seed(12)
        z = torch.randn(len(MIX), 300, generator=gen) * 2
        args = (*param_tensors(MIX), torch.arange(len(MIX)) * 7, torch.arange(len(MIX)))
        for impl, kw in ((TS, dict(block=BLOCK, chunk=CHUNK)), (R, {})):
            buf = torch.full((2, len(MIX), 300), -1.0)
            tok, q = impl.sample_draft(z, *args, True, probs_out=buf[1], **kw)
            want_tok, want_q = R.sample_draft(z, *args, True)
            assert q.data_ptr() == buf[1].data_ptr() and torch.equal(tok, want_tok)
            torch.testing.assert_close(buf[1], want_q, atol=1e-6, rtol=1e-5)
            assert torch.all(buf[0] == -1.0)

    KS = [0, 3, 1, 4, 2, 3]
    PARAMS = [PARAM_SETS["t1"], GREEDY, PARAM_SETS["t0.6_topk4"], PARAM_SETS["t0.8_all"],
              PARAM_SETS["t1.4_topp0.8"], PARAM_SETS["t1_minp0.1"]]

    @pytest.mark.parametrize("method,one_hot,dtype,chunk", [
        ("probabilistic", False, torch.float32, CHUNK),
        ("probabilistic", True, torch.float32, CHUNK),
        ("strict", False, torch.float32, CHUNK),
        ("probabilistic", False, torch.float16, None),
        ("strict", False, torch.float16, CHUNK)])
    def test_rejection_sample_matches_reference(method, one_hot, dtype, chunk) -> None:
        case = make_verify_case(KS, PARAMS, vocab=300, seed=12, dtype=dtype, noise=0.3,
                                one_hot=one_hot, scale=4.0)
        got = TS.rejection_sample(*case.args(method), block=BLOCK, chunk=chunk)
        want = R.rejection_sample(*case.args(method))
        assert torch.equal(got, want), f"\n{got}\n{want}"
        assert int((want[:, 1:] >= 0).sum()) >= 3          # drafts were accepted: the test bites

    @pytest.mark.parametrize("tuning", [TS.LEGACY, TS.Tuning(unroll=2, split=False, recover_unroll=1),
                                        TS.Tuning(unroll=1, parallel_accept=False),
                                        TS.Tuning(prefetch=True),
                                        TS.Tuning(unroll=2, split=False, prefetch=True),
                                        TS.Tuning(fused_race=True),
                                        TS.Tuning(fused_race=True, unroll=2, split=False, prefetch=True),
                                        TS.Tuning(race_whole_steps=True, recover_unroll=2),
                                        TS.Tuning(fused_race=True, race_whole_steps=True,
                                                  recover_unroll=2, prefetch=True),
                                        TS.Tuning(fused_race=True, race_early_loads=True)],
                             ids=["legacy", "unroll2-unsplit", "unroll1-serial-accept", "prefetch",
                                  "prefetch-unroll2-unsplit", "fused-race", "fused-race-prefetch-unsplit",
                                  "race-whole-steps", "fused-race-whole-steps",
                                  "fused-race-early-loads"])
    def test_every_tuning_matches_reference(tuning) -> None:
        """The launch knobs (loads per step, split greedy/sampled loops, parallel or serial
        accept tests, loads issued a step ahead) change how the work is spread, never a token: drafts and both
        verification methods equal the reference for each (the default is tested above)."""
        case = make_verify_case(KS, PARAMS, vocab=300, seed=12, noise=0.3, scale=4.0)
        for method in ("probabilistic", "strict"):
            got = TS.rejection_sample(*case.args(method), block=BLOCK, tuning=tuning)
            want = R.rejection_sample(*case.args(method))
            assert torch.equal(got, want), f"{method}\n{got}\n{want}"
        # one-hot drafts (no q): the rejected draft's token itself is taken out of the residual
        one_hot = make_verify_case(KS, PARAMS, vocab=300, seed=12, noise=0.3, scale=4.0,
                                   one_hot=True)
        got = TS.rejection_sample(*one_hot.args("probabilistic"), block=BLOCK, tuning=tuning)
        want = R.rejection_sample(*one_hot.args("probabilistic"))
        assert torch.equal(got, want), f"one-hot\n{got}\n{want}"
        # plain rows whose winners lie past the first race chunk (block 64: race_whole_steps
        # cuts V = 300 into [0, 256) and [256, 300)), so the chunks' combine decides them
        late = make_verify_case(KS, PARAMS, vocab=300, seed=21, noise=0.3, scale=4.0)
        late.target_logits[:, 256:] += 4.0
        got = TS.rejection_sample(*late.args("probabilistic"), block=BLOCK, tuning=tuning)
        want = R.rejection_sample(*late.args("probabilistic"))
        assert torch.equal(got, want), f"late winners\n{got}\n{want}"
        plain = [b for b, k in enumerate(KS) if k == 0]
        assert plain and bool((want[plain, 0] >= 256).all()), "the test must bite"
        gen = torch.Generator().manual_seed(18)
        z = torch.randn(len(MIX), 300, generator=gen) * 2
        args = (*param_tensors(MIX), torch.arange(len(MIX)) * 5 + 1, torch.arange(len(MIX)))
        tok, q = TS.sample_draft(z, *args, True, block=BLOCK, chunk=CHUNK * 2, tuning=tuning)
        want_tok, want_q = R.sample_draft(z, *args, True)
        assert torch.equal(tok, want_tok)
        torch.testing.assert_close(q, want_q, atol=1e-6, rtol=1e-5)

    @pytest.mark.parametrize("base", [TS.DEFAULT, TS.NARROW], ids=["default", "narrow"])
    def test_plain_rows_raced_in_the_row_pass_give_the_same_tokens(base, monkeypatch) -> None:
        """Tuning.plain_row_race moves plain sampling's race (no request has drafts) from the
        final race kernel into the row pass; the race, its random numbers and its tokens stay
        the same, and the final race kernel is not launched (unfiltered rows at T == 1 and
        T != 1, top-k, top-p, min-p and greedy rows). A batch with drafts never races in the
        row pass (its drafting requests' last tokens come by inverse CDF, the bonus too)."""
        from dataclasses import replace

        plain_params = PARAMS + UNFILTERED_T
        plain = make_verify_case([0] * len(plain_params), plain_params, vocab=300, seed=14,
                                 scale=2.0)
        want = R.rejection_sample(*plain.args("probabilistic"))
        assert torch.equal(TS.rejection_sample(*plain.args("probabilistic"), block=BLOCK,
                                               tuning=replace(base, plain_row_race=False)), want)
        case = make_verify_case(KS, PARAMS, vocab=300, seed=12, noise=0.3, scale=4.0)
        assert 0 in KS and max(KS) > 0
        want_drafts = R.rejection_sample(*case.args("probabilistic"))
        bonus = [(want_drafts[b] >= 0).sum().item() == k + 1 for b, k in enumerate(KS) if k > 0]
        assert sum(bonus) >= 2, "some requests must accept every draft: the bonus path bites"

        monkeypatch.setattr(TS.K, "final_race_kernel", _NoLaunch())
        for chunk in (CHUNK, None):
            got = TS.rejection_sample(*plain.args("probabilistic"), block=BLOCK, chunk=chunk,
                                      tuning=replace(base, plain_row_race=True))
            assert torch.equal(got, want), f"\n{got}\n{want}"
        monkeypatch.undo()
        assert not replace(base, plain_row_race=True).races_in_row_pass(max(KS))
        got = TS.rejection_sample(*case.args("probabilistic"), block=BLOCK, tuning=base)
        assert torch.equal(got, want_drafts), f"\n{got}\n{want_drafts}"

    def test_partials_width_covers_every_plan_with_its_loop_bound() -> None:
        """_chunks_pad's bound (a plan's chunks hold more than tiles // 2 tiles each) over every
        chunk length a plan can take, explicit ones included: the width, a function of the
        plan's compiled loop bound, covers its chunk count."""
        for vocab in (300, 1000, 32_000, 151_936):
            for block in (64, 512, 1024, 2048):
                tiles_row = triton.cdiv(vocab, block)
                for per in range(1, tiles_row + 1):
                    pl = TS.Plan(block, per * block, triton.cdiv(vocab, per * block), 4)
                    assert pl.num_chunks <= TS._chunks_pad(vocab, pl), (vocab, block, per)

    class _NoLaunch:
        """Stands in for a kernel that must not be launched: any launch fails the test."""

        def __getitem__(self, grid):
            raise AssertionError(f"a kernel launched (grid {grid}) where it must not be")

    def test_fused_race_is_one_launch_and_leaves_its_counts_at_zero(monkeypatch) -> None:
        """Tuning.fused_race: a probabilistic verification runs as verify_pass_kernel alone
        (the row pass, final race and finalize kernels are not launched), gives the
        reference's tokens call after call, and leaves every per-request count at zero (the
        next launch's race programs wait on counts that start from zero; a count left over
        would let them read partials not yet written, and no request would be finalized).
        Strict verification keeps the separate kernels."""
        from dataclasses import replace

        tuning = replace(TS.DEFAULT, fused_race=True)
        case = make_verify_case(KS, PARAMS, vocab=300, seed=12, noise=0.3, scale=4.0)
        want = R.rejection_sample(*case.args("probabilistic"))
        launched = []
        real = TS.K.verify_pass_kernel

        class _Counted:
            def __getitem__(self, grid):
                launched.append(grid)
                return real[grid]

        monkeypatch.setattr(TS.K, "verify_pass_kernel", _Counted())
        monkeypatch.setattr(TS.K, "final_race_kernel", _NoLaunch())
        monkeypatch.setattr(TS.K, "row_pass_kernel", _NoLaunch())
        monkeypatch.setattr(TS.K, "finalize_kernel", _NoLaunch())
        for chunk in (CHUNK, None, CHUNK):
            got = TS.rejection_sample(*case.args("probabilistic"), block=BLOCK, chunk=chunk,
                                      tuning=tuning)
            assert torch.equal(got, want), f"\n{got}\n{want}"
            counts = TS._race_counts(torch.device("cpu"), len(KS))
            assert counts is not None and int(counts.abs().sum()) == 0, counts.nonzero()
        assert len(launched) == 3
        monkeypatch.undo()
        strict = TS.rejection_sample(*case.args("strict"), block=BLOCK, tuning=tuning)
        assert torch.equal(strict, R.rejection_sample(*case.args("strict")))

    def test_greedy_drafts_masked_vocabulary_and_wide_output() -> None:
        case = make_verify_case([2, 0, 5], [PARAM_SETS["t1"], PARAM_SETS["t0.8_all"], GREEDY],
                                vocab=257, seed=13, noise=0.2, greedy_drafts=True,
                                one_hot=True, masked_tail=17)
        for method in ("probabilistic", "strict"):
            got = TS.rejection_sample(*case.args(method), max_num_draft_tokens=7, block=BLOCK,
                                      chunk=CHUNK)
            want = R.rejection_sample(*case.args(method), max_num_draft_tokens=7)
            assert got.shape == (3, 8) and torch.equal(got, want), f"\n{got}\n{want}"

    # unfiltered rows: T == 1 (the kernels skip the division), T != 1 (1 + 2**-23 is the
    # nearest fp32 above 1), greedy; the filtered rows of MIX / PARAMS cover T != 1 only filtered
    UNFILTERED_T = [(1.0, 0, 1.0, 0.0), (0.7, 0, 1.0, 0.0), GREEDY, (1.0 + 2**-23, 0, 1.0, 0.0),
                    (1.3, 0, 1.0, 0.0)]

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
    def test_temperature_one_and_other_rows_match_reference(dtype) -> None:
        """Rows with T == 1, T != 1 and greedy rows in one batch: draft tokens, q and both
        verification methods match the reference (chunked row pass and final race)."""
        gen = torch.Generator().manual_seed(16)
        n = len(UNFILTERED_T)
        z = (torch.randn(n, 300, generator=gen) * 2).to(dtype)
        args = (*param_tensors(UNFILTERED_T), torch.arange(n) * 31 + 2, torch.arange(n) + 9)
        tok, q = TS.sample_draft(z, *args, True, block=BLOCK, chunk=CHUNK)
        want_tok, want_q = R.sample_draft(z, *args, True)
        assert torch.equal(tok, want_tok)
        assert torch.equal(q > 0, want_q > 0)
        torch.testing.assert_close(q, want_q, atol=1e-6, rtol=1e-5)
        case = make_verify_case([3, 2, 1, 4, 0], UNFILTERED_T, vocab=300, seed=17, dtype=dtype,
                                noise=0.3, scale=4.0)
        for method in ("probabilistic", "strict"):
            got = TS.rejection_sample(*case.args(method), block=BLOCK, chunk=CHUNK)
            want = R.rejection_sample(*case.args(method))
            assert torch.equal(got, want), f"{method}\n{got}\n{want}"

    @pytest.mark.parametrize("breakage", ["wrong_row_q", "skipped_chunk", "bonus_from_residual",
                                          "bonus_reuses_accept_draw"],
                             ids=["wrong-row-q", "chunk-left-out", "bonus-from-residual",
                                  "bonus-reuses-accept-draw"])
    def test_triton_breakages_change_tokens(breakage, tmp_path) -> None:
        """The exactness harness's deliberate Triton breakages (its GPU test) still bite on the
        default launch path: each changes tokens of a plain batch (bf16_q needs the GPU's
        production shapes to show)."""
        try:
            from tests.kernels.sampler_breakages import broken_module
        except ImportError:  # rootdir-less runs of this directory
            from sampler_breakages import broken_module
        case = make_verify_case([3] * 12, [PARAM_SETS["t1"]] * 12, vocab=200, seed=21, noise=0.3,
                                scale=4.0)
        want = R.rejection_sample(*case.args("probabilistic"))
        broken = broken_module(breakage, "triton", tmp_path)
        got = broken.rejection_sample(*case.args("probabilistic"), block=32, chunk=64)
        assert not torch.equal(got, want)

    def test_zero_draft_probability_is_a_rejection() -> None:
        case = make_verify_case([2], [PARAM_SETS["t1"]], vocab=64, seed=14)
        x = int(case.drafts[0])
        case.q[0, x] = 0.0
        got = TS.rejection_sample(*case.args("probabilistic"), block=BLOCK)
        assert got[0, 1] == -1 and got[0, 0] >= 0

    def test_recovery_resolves_a_tail_of_1e_7_tokens_like_the_twin() -> None:
        """Rows of one heavy token followed, in the same tiles, by tail tokens of weight ~1e-7
        (below a 23-bit step); each request's draft has p = 0, so it is rejected and the
        recovery draws from the whole row. Seeds are picked so that uniform52 lands in the tail
        (prob. ~6e-5 each): the kernels, with their own tiles, must emit the twin's exact
        token, a tail token every time. An fp32 search misses most such tokens (the twin's
        test, test_ref_sampling.py, shows that against the old search)."""
        v, heavy, n = 600, 10, 6
        z = torch.full((v,), math.log(1e-7))
        z[heavy] = 0.0
        z[3] = float("-inf")                                      # the draft: p = 0
        tail_from = 1.0 / (1.0 + (v - heavy - 1) * 1e-7)          # u above this: a tail token
        pool = torch.arange(2_000_000)
        u = P.uniform52(pool, torch.zeros_like(pool), P.RECOVER)
        seeds = pool[u > tail_from + 1e-9][:n]
        assert seeds.numel() == n
        logits = z.expand(2 * n, v).contiguous()                  # verification + bonus row each
        cu = torch.arange(n + 1, dtype=torch.int32)
        drafts = torch.full((n,), 3, dtype=torch.int64)
        args = (logits, cu, drafts, None, *param_tensors([PARAM_SETS["t1"]] * n), seeds,
                torch.zeros(n, dtype=torch.int64), "probabilistic")
        want = R.rejection_sample(*args)
        got = TS.rejection_sample(*args, block=BLOCK)
        assert torch.equal(got, want), f"\n{got}\n{want}"
        assert bool((want[:, 0] > heavy).all()) and bool((want[:, 1] == -1).all())

    @pytest.mark.parametrize("vocab,max_reqs,max_drafts", [(151_936, 256, 4), (151_936, 64, 8),
                                                           (4096, 64, 4), (32_000, 128, 5)])
    def test_warm_up_reaches_every_compiled_variant(monkeypatch, vocab, max_reqs, max_drafts) -> None:
        """Every batch a server can run selects kernel variants (compile-time constants) that the
        start-up warm-up already compiled; a miss is a multi-second JIT stall in the middle of
        traffic (measured on an H100). Plans as on a 132-SM GPU."""
        monkeypatch.setattr(TS, "_sm_count", lambda index: 132)
        dev = torch.device("cuda", 0)                      # plan() only reads the SM count
        draft_rows, shapes = TS.warm_up_shapes(vocab, max_reqs, max_drafts, dev)
        tiles = lambda rows: TS.plan(vocab, rows, dev, tuning=TS.DRAFT_TUNING).tiles  # noqa: E731
        assert {tiles(b) for b in range(1, max_reqs + 1)} == {tiles(b) for b in draft_rows}

        row_key, race = {}, {}

        def variant(reqs: int, k: int, rows: int) -> tuple:
            """What a verification compiles for: its tuning (chosen by its row count), the row
            pass's and the final race's loop bounds under it, the output width, and whether the
            row pass races plain sampling's rows (Tuning.plain_row_race)."""
            if rows not in row_key:
                t = TS.verification_tuning(rows)
                row_key[rows] = (t, TS.plan(vocab, rows, dev, tuning=t).tiles)
            t, tiles = row_key[rows]
            if (reqs, t) not in race:
                race[(reqs, t)] = TS.race_plan(vocab, reqs, dev, tuning=t).tiles
            return (t, tiles, race[(reqs, t)], 1 << k.bit_length(), t.races_in_row_pass(k))

        # every batch: B requests whose widest has k drafts verify B + k .. B (k + 1) rows (the
        # others may draft fewer, near their max_tokens)
        every = {variant(r, k, rows) for r in range(1, max_reqs + 1) for k in range(max_drafts + 1)
                 for rows in (range(r, r + 1) if k == 0 else range(r + k, r * (k + 1) + 1))}
        assert every <= {variant(r, k, rows) for r, rows, k in shapes}
        assert len(shapes) == len({variant(r, k, rows) for r, rows, k in shapes})   # no repeats
        assert all(r <= max_reqs and k <= max_drafts and (r + k <= rows <= r * (k + 1) if k else rows == r)
                   for r, rows, k in shapes)
        # the partials' width follows the plan's loop bound and covers its chunk count
        plans = [TS.plan(vocab, rows, dev, tuning=t) for rows in range(1, max_reqs * (max_drafts + 1) + 1)
                 for t in (TS.LEGACY, TS.DEFAULT)]
        assert all(p.num_chunks <= TS._chunks_pad(vocab, p) for p in plans)

    @pytest.mark.parametrize("method,with_probs,store", [("probabilistic", True, True),
                                                          ("strict", False, True),
                                                          ("probabilistic", False, False)])
    def test_warm_up_runs_every_representative_shape(method, with_probs, store) -> None:
        """The start-up warm-up (compiling variants before traffic) must itself run cleanly."""
        calls = TS.warm_up(300, 5, 3, method, with_probs, store, torch.float32, torch.device("cpu"))
        assert calls >= 4
