"""Compile every sampling kernel for an H100 (sm_90) on this CPU machine: no GPU needed.

The interpreter forgives things the compiler does not (non-constexpr globals, loop-carried
values changing type, Python ``not`` on tensors); this catches them before the GPU machine does.
bf16 logits and the real vocabulary size (151,936), with the launch configuration
kernels.triton_sampling uses.
"""

from __future__ import annotations

import os

import pytest

triton = pytest.importorskip("triton")

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels; not under the interpreter", allow_module_level=True)

V = 151_936
P32, PI32, PI64 = "*fp32", "*i32", "*i64"


def _compile(fn, sig: dict, consts: dict, num_warps: int = 4):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    full = dict(sig)
    full.update({k: "constexpr" for k in consts})
    src = ASTSource(fn=fn, signature=full, constexprs=consts)
    out = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    assert out.asm.get("cubin"), f"{fn.__name__}: no cubin"
    return out


ROW_SIG = dict(logits_ptr="*bf16", stride="i32", chunk="i32", C="i32", cu_ptr=PI32, B="i32",
               temp_ptr=P32,
               topk_ptr=PI32, topp_ptr=P32, minp_ptr=P32, seed_ptr=PI64, pos_ptr=PI64,
               part_m=P32, part_s=P32, part_rv=P32, part_ri=PI32, part_gv=P32, part_gi=PI32,
               row_thr=P32, stream="i32")
FINAL_RACE_SIG = dict(logits_ptr="*fp16", stride="i32", chunk="i32", C="i32", CR="i32",
                      cu_ptr=PI32, drafts_ptr=PI64, q_ptr=P32, temp_ptr=P32, seed_ptr=PI64,
                      pos_ptr=PI64, part_m=P32, part_s=P32, row_thr=P32, rec_v=P32, rec_i=PI32,
                      n_acc_ptr=PI32, row_stat=P32, tile_sums="*fp64")
FINALIZE_SIG = dict(logits_ptr="*bf16", stride="i32", cu_ptr=PI32, drafts_ptr=PI64, q_ptr=P32,
                    temp_ptr=P32, seed_ptr=PI64, pos_ptr=PI64, part_rv=P32, part_ri=PI32,
                    part_gv=P32, part_gi=PI32, rec_v=P32, rec_i=PI32, n_acc_ptr=PI32, row_stat=P32,
                    tile_sums="*fp64", out_ptr=PI64, W="i32", C="i32", CR="i32", NTILES="i32")
DRAFT_FINISH_SIG = dict(logits_ptr="*bf16", stride="i32", chunk="i32", C="i32", temp_ptr=P32,
                        part_m=P32, part_s=P32, part_rv=P32, part_ri=PI32, part_gv=P32,
                        part_gi=PI32, row_thr=P32, tok_ptr=PI64, q_ptr=P32)


@pytest.mark.parametrize("has_cu,race,last,unroll,split", [
    (True, False, False, 4, True), (False, True, False, 4, True), (True, False, False, 1, False),
    (False, True, False, 2, False), (True, False, True, 4, True), (True, False, True, 1, False)])
def test_row_pass_kernel_compiles(has_cu: bool, race: bool, last: bool, unroll: int,
                                  split: bool) -> None:
    from specserve.kernels import sampling_triton_kernels as K

    _compile(K.row_pass_kernel, ROW_SIG, dict(V=V, HAS_CU=has_cu, RACE=race, LAST=last, NB=512,
                                              BLOCK=1024, NT=16, SBLOCK=256, TILES=128 // unroll,
                                              UNROLL=unroll, SPLIT=split))


@pytest.mark.parametrize("has_q,parallel,unroll", [(True, True, 4), (False, True, 4), (True, False, 1)])
def test_final_race_kernel_compiles(has_q: bool, parallel: bool, unroll: int) -> None:
    from specserve.kernels import sampling_triton_kernels as K

    _compile(K.final_race_kernel, FINAL_RACE_SIG, dict(V=V, HAS_Q=has_q, CP=32, TP=256, BLOCK=1024, TILES=32,
                                                       KP=16, PARALLEL=parallel, UNROLL=unroll))


VERIFY_PASS_SIG = dict(ROW_SIG, race_chunk="i32", CR="i32", drafts_ptr=PI64, q_ptr=P32, rec_v=P32,
                       rec_i=PI32, n_acc_ptr=PI32, row_stat=P32, tile_sums="*fp64", counts=PI32,
                       CAP="i32", NROW="i32", out_ptr=PI64, W="i32", NTILES="i32")


@pytest.mark.parametrize("has_q,prefetch,pdl", [(True, False, True), (False, True, False)])
def test_verify_pass_kernel_compiles_with_its_wait_past_l1(has_q: bool, prefetch: bool,
                                                           pdl: bool) -> None:
    """The fused row pass and final race (Tuning.fused_race): its counts' atomics carry their
    order (release, acquire at GPU scope) and the partials it reads after the wait bypass L1
    (ld.global.cg), as the wait's correctness needs; checked in the PTX."""
    from specserve.kernels import sampling_triton_kernels as K

    out = _compile(K.verify_pass_kernel, VERIFY_PASS_SIG,
                   dict(V=V, NB=512, BLOCK=1024, NT=16, SBLOCK=256, TILES=8, UNROLL=4, SPLIT=True,
                        PREFETCH=prefetch, HAS_Q=has_q, CP=8, TP=256, RBLOCK=1024, RTILES=16,
                        KP=8, RUNROLL=4, CRP=32, WP=8, PDL=pdl))
    ptx = out.asm["ptx"]
    assert "atom.global.gpu.release.add" in ptx, "a row program's arrival lost its release"
    assert "atom.global.gpu.acq_rel.add" in ptx, "a race program's arrival lost its order"
    assert "ld.global.gpu.acquire" in ptx, "the race programs' wait lost its acquire"
    # what the launch itself wrote and reads back: the accept tests' maxima, sums and
    # thresholds, finalize's argmax partials, row statistics, tile sums and accepted count
    assert ptx.count("ld.global.cg") >= 8, "same-launch data is read through L1"


def test_finalize_and_draft_kernels_compile() -> None:
    from specserve.kernels import sampling_triton_kernels as K

    for strict, has_q, last in ((False, True, False), (False, False, False), (True, False, False),
                                (False, True, True)):
        _compile(K.finalize_kernel, FINALIZE_SIG, dict(V=V, STRICT=strict, HAS_Q=has_q, CP=32,
                                                       CRP=256, TP=256, BLOCK=1024, WP=16,
                                                       LAST=last), num_warps=4)
    _compile(K.draft_finish_kernel, DRAFT_FINISH_SIG, dict(V=V, STORE=True, CP=32, BLOCK=1024, TILES=8))


def _first(ptx: str, *needles: str) -> int:
    """Index of the first line of ``ptx`` holding any of ``needles`` (len(lines) if none)."""
    lines = ptx.splitlines()
    return next((i for i, line in enumerate(lines) if any(n in line for n in needles)), len(lines))


KERNELS = ["row_pass", "final_race", "finalize", "draft_finish"]


def _kernel_cases() -> dict:
    """(kernel, signature, constexprs) of each sampling kernel on its widest path: the row
    pass with sampled rows, the final race with draft probabilities, the probabilistic
    finalize, the draft finish storing q."""
    from specserve.kernels import sampling_triton_kernels as K

    return {
        "row_pass": (K.row_pass_kernel, ROW_SIG, dict(V=V, HAS_CU=True, RACE=False, LAST=False,
                                                      NB=512, BLOCK=1024, NT=16, SBLOCK=256,
                                                      TILES=32, UNROLL=4, SPLIT=True)),
        "final_race": (K.final_race_kernel, dict(FINAL_RACE_SIG, logits_ptr="*bf16"),
                       dict(V=V, HAS_Q=True, CP=32, TP=256, BLOCK=1024, TILES=32, KP=4,
                            PARALLEL=True, UNROLL=4)),
        "finalize": (K.finalize_kernel, FINALIZE_SIG, dict(V=V, STRICT=False, HAS_Q=True, CP=32,
                                                      CRP=256, TP=256, BLOCK=1024, WP=4,
                                                      LAST=False)),
        "draft_finish": (K.draft_finish_kernel, DRAFT_FINISH_SIG,
                         dict(V=V, STORE=True, CP=32, BLOCK=1024, TILES=8)),
    }


@pytest.mark.parametrize("kernel", KERNELS)
def test_with_pdl_each_kernel_waits_before_its_first_memory_access(kernel: str) -> None:
    """Tuning.pdl launches a kernel while the one before it runs: its first global load or store
    must come after griddepcontrol.wait (else it may read what that kernel has not written yet),
    and the release of the next kernel after the wait too. Without PDL neither instruction."""
    fn, sig, consts = _kernel_cases()[kernel]
    plain = _compile(fn, sig, dict(consts, PDL=False)).asm["ptx"]
    assert "griddepcontrol" not in plain
    ptx = _compile(fn, sig, dict(consts, PDL=True)).asm["ptx"]
    wait = _first(ptx, "griddepcontrol.wait")
    release = _first(ptx, "griddepcontrol.launch_dependents")
    access = _first(ptx, "ld.global", "st.global", "atom.global", "red.global", "cp.async",
                    "ld.volatile.global", "ld.relaxed", "ld.acquire")
    end = len(ptx.splitlines())
    assert wait < end, f"{kernel}: no griddepcontrol.wait"
    assert wait < release < end, f"{kernel}: release before the wait, or none"
    assert access < end, f"{kernel}: no global access found (the search would prove nothing)"
    assert wait < access, f"{kernel}: a global access before griddepcontrol.wait"


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_exp_is_the_flush_to_zero_ex2(kernel: str) -> None:
    """The kernels' exps go through ``_exp`` (exp2 of x log2 e: PTX ``ex2.approx.ftz.f32``).
    ``tl.exp`` emits the non-ftz ``ex2.approx.f32``, which ptxas guards against denormal results
    with three more instructions per element: half of the row pass's instructions per logit
    before 2026-11-28. A new ``tl.exp`` in a kernel fails here."""
    fn, sig, consts = _kernel_cases()[kernel]
    ptx = _compile(fn, sig, dict(consts, PDL=False)).asm["ptx"]
    assert "ex2.approx.ftz.f32" in ptx, f"{kernel}: no exp found (the check would prove nothing)"
    assert "ex2.approx.f32" not in ptx, f"{kernel}: an exp with the denormal guard (tl.exp)"


def test_no_sampling_kernel_source_calls_tl_exp() -> None:
    """The PTX check above compiles one path per kernel; a ``tl.exp`` on another path (the
    serial accept tests, a filtered row) would pass it, so the source is checked too."""
    from pathlib import Path

    from specserve.kernels import sampling_triton_kernels as K

    code = [line.split("#")[0] for line in Path(K.__file__).read_text().splitlines()]
    assert not [line for line in code if "tl.exp(" in line and '"""' not in line]


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_row_pass_kernel_compiles_with_prefetch(unroll: int) -> None:
    """Tuning.prefetch carries the raw block across loop steps (a loop-carried value of the
    logits' dtype): compiled for sm_90 at each unroll."""
    from specserve.kernels import sampling_triton_kernels as K

    _compile(K.row_pass_kernel, ROW_SIG, dict(V=V, HAS_CU=True, RACE=False, LAST=False, NB=512,
                                              BLOCK=1024, NT=16, SBLOCK=256, TILES=64 // unroll,
                                              UNROLL=unroll, SPLIT=True, PREFETCH=True))
