"""Compile the MEPIC kernels for real GPU targets without a GPU (a CI check).

    python -m sglang_mepic.kernels.aot

`triton.compile` with a `GPUTarget` runs the full pipeline to PTX and cubin, so
GPU-only breakage (a construct the interpreter accepts but the compiler does
not) is caught on a CPU machine. Run without TRITON_INTERPRET.
"""

import os
import sys
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_mepic.kernels import attention as k

TARGETS = (GPUTarget("cuda", 90, 32), GPUTarget("cuda", 80, 32))
INT_ARGS = {"stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_vs", "stride_vh", "stride_ot", "stride_oh",
            "stride_rt", "stride_rp", "stride_cs"}
INDEX_ARGS = {"ReqToToken", "ReqToPos", "ReqIdx", "SeqLens", "QPos", "QStart", "ExtLens", "Positions"}


def signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name == "sm_scale":
            sig[name] = "fp32"
        elif name in INT_ARGS:
            sig[name] = "i32"
        elif name in INDEX_ARGS:
            sig[name] = "*i32"
        elif name == "CosSin":
            sig[name] = "*fp32"
        else:
            sig[name] = f"*{dtype}"
    return sig


def configs():
    # (dtype, head dim, group, rotary dim, neox): head dims 64/128, GQA groups 1, 3, 4, 8,
    # neox and gptj, partial rotary, fp16/bf16/fp32.
    for dtype, d, group, rot, neox in (("fp16", 128, 4, 128, True), ("bf16", 64, 3, 64, True),
                                       ("bf16", 128, 8, 64, False), ("fp32", 64, 1, 64, True)):
        yield "decode", k._mepic_decode_kernel, dtype, dict(
            GROUP=group, GROUP_P=triton.next_power_of_2(group), D=d, DV=d, ROT=rot, NEOX=neox, BLOCK_N=64)
        yield "extend", k._mepic_extend_kernel, dtype, dict(
            GROUP=group, D=d, DV=d, ROT=rot, NEOX=neox, BLOCK_M=64, BLOCK_N=64, DOT_FP32=dtype == "fp32")


def main() -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter replaces the kernels the compiler needs", file=sys.stderr)
        return 2
    failures = 0
    for target in TARGETS:
        for name, fn, dtype, constexprs in configs():
            src = ASTSource(fn=fn, signature=signature(fn, dtype, constexprs), constexprs=constexprs)
            label = (f"{target.backend}:{target.arch} {name} {dtype} D={constexprs['D']} "
                     f"group={constexprs['GROUP']} rot={constexprs['ROT']} neox={constexprs['NEOX']}")
            start = time.perf_counter()
            try:
                compiled = triton.compile(src, target=target, options={"num_warps": 4})
                assert "ptx" in compiled.asm and "cubin" in compiled.asm
                print(f"{label}: ok in {time.perf_counter() - start:.1f} s, "
                      f"{compiled.metadata.shared} B shared", flush=True)
            except Exception as e:  # report every failure, not just the first
                failures += 1
                lines = [x for x in str(e).splitlines() if x.strip()]
                print(f"{label}: FAILED {type(e).__name__}: {lines[-1] if lines else ''}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
