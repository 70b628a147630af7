"""Compiling a Triton kernel for an H100 (sm_90) on a machine without a GPU: through Triton's real
CUDA pipeline to a cubin, with the ptxas bundled in the Triton wheel. The interpreter tests check
what a kernel computes; this sees GPU code generation (loop-carried types, layouts, registers,
shared memory)."""

from __future__ import annotations

from typing import Optional

import pytest

H100_SMEM = 227 * 1024     # shared memory per block


def compile_for_h100(fn, constexprs: dict, dtype: str = "bf16", typed: Optional[dict] = None,
                     num_warps: int = 4, num_stages: int = 3):
    """The compiled kernel of ``fn`` at ``constexprs``. Argument types from their names: those
    in ``typed`` as given, other pointers (``*_ptr``, ``*_buf``) of ``dtype``, ``scale`` and
    ``eps`` fp32, strides i64, other integers i32. Skips the test where this Triton has no
    bundled ptxas."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    typed = typed or {}
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in typed:
            sig[name] = typed[name]
        elif name.endswith(("_ptr", "_buf")):
            sig[name] = "*" + dtype
        elif name in ("scale", "eps"):
            sig[name] = "fp32"
        else:
            sig[name] = "i64" if name.startswith("stride") else "i32"
    src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})
    try:
        return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": num_warps, "num_stages": num_stages})
    except FileNotFoundError as e:  # a Triton build without its bundled ptxas
        pytest.skip(f"no CUDA toolchain in this Triton install: {e}")


def pdl_ordered(ptx: str) -> bool:
    """Whether a kernel's PTX follows the PDL protocol (kernels/triton_pdl.py): one
    ``griddepcontrol.wait``, before every global load and store and before the release of the
    next kernel. False where it has no wait at all."""
    wait = ptx.find("griddepcontrol.wait")
    if wait < 0 or ptx.count("griddepcontrol.wait") != 1:
        return False
    release = ptx.find("griddepcontrol.launch_dependents")
    memory = [i for i in (ptx.find("ld.global"), ptx.find("st.global")) if i >= 0]
    return release > wait and all(i > wait for i in memory)
