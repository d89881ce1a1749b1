"""Compile the MEPIC kernels for real GPU targets without a GPU (a CI check).

    python -m sglang_mepic.kernels.aot [--arch 90 80] [--only decode|extend|merge]

`triton.compile` with a `GPUTarget` runs the full pipeline to PTX and cubin, so
GPU-only breakage (a construct the interpreter accepts but the compiler does
not) is caught on a CPU machine. Then `ptxas -v` (Triton ships it) reports each
kernel's registers and spills, in one table. Exit status 1 on any failure or
any spill: a spill is local-memory traffic in the inner loop, the first thing
that made the old kernels slow. Run without TRITON_INTERPRET.

Each configuration is a launch the backend makes (`launch_config`), for the
head shapes of the models it serves.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglang_mepic.kernels import attention as k

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
FLOAT_ARGS = {"sm_scale", "mscale"}
FP32_POINTERS = {"CosSin", "InvFreq", "PartialOut", "PartialLse"}
INDEX_POINTERS = {"ReqToToken", "ReqToPos", "ReqIdx", "SeqLens", "QPos", "QStart", "ExtLens", "Positions", "NumSplits"}


def signature(fn, dtype: str, constexprs: dict) -> dict:
    sig = {}
    for name in fn.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in FLOAT_ARGS:
            sig[name] = "fp32"
        elif name.startswith("stride_"):
            sig[name] = "i32"
        elif name in INDEX_POINTERS:
            sig[name] = "*i32"
        elif name in FP32_POINTERS:
            sig[name] = "*fp32"
        else:
            sig[name] = f"*{dtype}"
    return sig


# (model, dtype, head dim, query heads, kv heads, rotary dim, neox)
MODELS = (
    ("Llama-3-8B", "bf16", 128, 32, 8, 128, True),
    ("Qwen2-7B (group 7)", "bf16", 128, 28, 4, 128, True),
    ("Llama-2-7B (MHA, fp16)", "fp16", 128, 32, 32, 128, True),
    ("SmolLM2-135M (group 3)", "bf16", 64, 9, 3, 64, True),
    ("partial rotary, gptj", "bf16", 128, 32, 8, 64, False),
    ("fp32", "fp32", 64, 4, 2, 64, True),
)


def configs(arch: int):
    for model, dtype, d, hq, hkv, rot, neox in MODELS:
        for table in (False, True):
            rope = "table" if table else "chip"
            common = dict(D=d, DV=d, ROT=rot, NEOX=neox, TABLE=table, DOT_FP32=dtype == "fp32")
            torch_dtype = TORCH_DTYPES[dtype]
            dec = k.launch_config("decode", d, torch_dtype, arch)
            ext = k.launch_config("extend", d, torch_dtype, arch)
            group_p, tokens = k.extend_tile(hq // hkv, ext["block_m"])
            block_h, head_tiles = k.decode_tiles(hq // hkv, dec["block_h"])
            yield dict(kernel="decode", model=model, dtype=dtype, rope=rope, fn=k._mepic_decode_kernel,
                       warps=dec["num_warps"], stages=dec["num_stages"],
                       constexprs=dict(GROUP=hq // hkv, HEAD_TILES=head_tiles, BLOCK_H=block_h,
                                       BLOCK_N=dec["block_n"], **common))
            yield dict(kernel="extend", model=model, dtype=dtype, rope=rope, fn=k._mepic_extend_kernel,
                       warps=ext["num_warps"], stages=ext["num_stages"],
                       constexprs=dict(GROUP=hq // hkv, GROUP_P=group_p, BLOCK_M=group_p * tokens,
                                       BLOCK_N=ext["block_n"], **common))
        yield dict(kernel="merge", model=model, dtype=dtype, rope="-", fn=k._merge_kernel, warps=4, stages=3,
                   constexprs=dict(DV=d, MAX_SPLITS=k.MAX_KV_SPLITS, BLOCK_N=dec["block_n"]))


def ptxas_report(ptx: str, arch: int) -> tuple[int, int]:
    """(registers, spill bytes stored + loaded) from Triton's own ptxas."""
    from triton.backends.nvidia.compiler import get_ptxas

    tool = get_ptxas(arch)
    ptxas = getattr(tool, "path", tool)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
        out = subprocess.run([ptxas, "-v", f"--gpu-name={gpu}", src, "-o", os.path.join(tmp, "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = out.stdout + out.stderr
    regs = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return regs, spills


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--only", choices=("decode", "extend", "merge"))
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter replaces the kernels the compiler needs", file=sys.stderr)
        return 2
    failures = 0
    print("| target | kernel | model | dtype | rope | warps | registers | spill bytes | shared B | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arch in args.arch:
        target = GPUTarget("cuda", arch, 32)
        for c in configs(arch):
            if args.only and c["kernel"] != args.only:
                continue
            src = ASTSource(fn=c["fn"], signature=signature(c["fn"], c["dtype"], c["constexprs"]),
                            constexprs=c["constexprs"])
            label = f"| sm_{arch} | {c['kernel']} | {c['model']} | {c['dtype']} | {c['rope']} | {c['warps']} "
            start = time.perf_counter()
            try:
                compiled = triton.compile(src, target=target,
                                          options={"num_warps": c["warps"], "num_stages": c["stages"]})
                assert "ptx" in compiled.asm and "cubin" in compiled.asm
                regs, spills = ptxas_report(compiled.asm["ptx"], arch)
                failures += spills > 0
                print(f"{label}| {regs} | {spills}{' SPILLS' if spills else ''} | {compiled.metadata.shared} "
                      f"| {time.perf_counter() - start:.1f} |", flush=True)
            except Exception as e:  # report every failure, not just the first
                failures += 1
                lines = [x for x in str(e).splitlines() if x.strip()]
                print(f"{label}| FAILED {type(e).__name__}: {lines[-1] if lines else ''} |", flush=True)
    print(f"\n{'no spills, all compiled' if not failures else f'{failures} configuration(s) failed or spilled'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
