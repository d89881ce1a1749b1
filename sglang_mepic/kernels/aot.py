"""Compile the MEPIC kernels for real GPU targets without a GPU (a CI check).

    python -m sglang_mepic.kernels.aot [--arch 90 80] [--only decode|extend|merge]

Each configuration is a launch the backend makes: `decode(...)` and
`extend(...)` are called on small CPU tensors of the served models' head
shapes with `JITFunction.run` intercepted (`capture`), and each intercepted
launch is compiled the way Triton's launcher would compile it on a GPU
(`compile_launch`): the same binder specializes the arguments, so aligned
pointers and strides divisible by 16 carry `tt.divisibility = 16`, index
tensors carry the dtypes the server passes (int64 `req_pool_indices`,
`seq_lens`, `positions`; int32 `req_to_token`), and ints equal to 1 become
constants. `triton.compile` with a `GPUTarget` then runs the full pipeline to
PTX and cubin, so GPU-only breakage is caught on a CPU machine, and `ptxas -v`
(Triton ships it) reports registers and spills. Exit status 1 on any failure
or spill: a spill is local-memory traffic in the inner loop.

The same machinery compiles SGLang's own kernels for the static performance
model (`python -m eval.bench.kernel_model`), which also reads the compiled SASS
(`sass`, `inner_loop`). Run without TRITON_INTERPRET.
"""

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import JITFunction, create_function_from_signature

from sglang_mepic.kernels import attention as k

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Launch:
    fn: JITFunction
    args: tuple
    kwargs: dict
    grid: tuple

    @property
    def name(self) -> str:
        return self.fn.__name__

    def constexpr(self, name: str) -> Any:
        if name in self.kwargs:
            return self.kwargs[name]
        i = self.fn.arg_names.index(name)
        return self.args[i] if i < len(self.args) else self.fn.params[i].default

    @property
    def num_warps(self) -> int:
        return self.kwargs.get("num_warps", 4)


@contextlib.contextmanager
def capture() -> Iterator[list[Launch]]:
    """Record every `kernel[grid](...)` launch in the block instead of running it."""
    launches: list[Launch] = []
    original = JITFunction.run

    def run(self: JITFunction, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> None:
        launches.append(Launch(self, args, kwargs, tuple(grid) if not callable(grid) else grid))

    JITFunction.run = run
    try:
        yield launches
    finally:
        JITFunction.run = original


@contextlib.contextmanager
def target_arch(arch: int) -> Iterator[None]:
    """Our wrappers pick their launch configuration for this architecture (on a CPU: 90)."""
    original = k.device_arch
    k.device_arch = lambda device: arch
    try:
        yield
    finally:
        k.device_arch = original


def compile_launch(launch: Launch, arch: int) -> Any:
    """The kernel Triton's launcher would build for these arguments on an sm_`arch` GPU."""
    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    fn = launch.fn
    kwargs = dict(launch.kwargs, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options.__dict__)


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


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
    # ptxas -v always prints the count (were it missing, main would report the AttributeError as a failure)
    regs = int(cast(re.Match[str], re.search(r"Used (\d+) registers", text)).group(1))
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return regs, spills


def sass(cubin: bytes) -> str:
    """nvdisasm's listing of a cubin (labels and instructions)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        out = subprocess.run([_tool("nvdisasm"), "-c", path], capture_output=True, text=True, check=True)
    return out.stdout


_INSTR = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\s+`?\(?(\.L_x_\d+)\)?")
MMA = ("HMMA", "HGMMA", "WGMMA", "FFMA")


@dataclass
class Loop:
    label: str
    instructions: list[str]  # the body, from the label to the backward branch (inclusive)

    @property
    def size(self) -> int:
        return len(self.instructions)

    def count(self, *opcodes: str) -> int:
        return sum(1 for i in self.instructions if _opcode(i).split(".")[0] in opcodes)


def _opcode(instr: str) -> str:
    parts = instr.split()
    return parts[1] if parts and parts[0].startswith("@") and len(parts) > 1 else (parts[0] if parts else "")


def loops(listing: str) -> list[Loop]:
    """Every backward branch's body: the instructions between its target label and the branch."""
    found: list[Loop] = []
    labels: dict[str, int] = {}
    body: list[str] = []
    for line in listing.splitlines():
        m = _LABEL.match(line.strip())
        if m:
            labels[m.group(1)] = len(body)
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        body.append(m.group(1))
        b = _BRANCH.search(m.group(1))
        if b and b.group(1) in labels:
            start = labels[b.group(1)]
            if start < len(body) - 1:  # not the trap's `BRA .L_x_n` to itself
                found.append(Loop(b.group(1), body[start:]))
    return found


def inner_loop(listing: str, nth: int = 0) -> Loop | None:
    """The main loop of an attention kernel: of the loops issuing matrix instructions, the one with the
    most (the key-tile loop); `nth` picks the next ones (SGLang's extend has a prefix and an extend loop)."""
    mma = [lp for lp in loops(listing) if lp.count("HMMA", "HGMMA")]
    # A nested loop is counted inside its enclosing one; keep the outermost loops that hold MMAs.
    outer = [lp for lp in mma if not any(o is not lp and o.size > lp.size and _contains(o, lp) for o in mma)]
    outer.sort(key=lambda lp: -lp.count("HMMA", "HGMMA"))
    return outer[nth] if nth < len(outer) else None


def _contains(outer: Loop, inner: Loop) -> bool:
    n = len(inner.instructions)
    return any(outer.instructions[i:i + n] == inner.instructions for i in range(len(outer.instructions) - n + 1))


# (model, dtype, head dim, query heads, kv heads, rotary dim, neox)
MODELS = (
    ("Llama-3-8B", "bf16", 128, 32, 8, 128, True),
    ("Qwen2-7B (group 7)", "bf16", 128, 28, 4, 128, True),
    ("Llama-2-7B (MHA, fp16)", "fp16", 128, 32, 32, 128, True),
    ("SmolLM2-135M (group 3)", "bf16", 64, 9, 3, 64, True),
    ("partial rotary, gptj", "bf16", 128, 32, 8, 64, False),
    ("fp32", "fp32", 64, 4, 2, 64, True),
)


# An fp8 KV cache under a bf16 model (issue 73), on the targets whose Triton has fp8 (sm_89 and later): one
# model's shapes, each format, on-chip cos/sin (the key loads are the same for the table).
FP8_MODELS = (("Llama-3-8B, KV fp8_e4m3", "bf16", 128, 32, 8, 128, True, torch.float8_e4m3fn),
              ("Llama-3-8B, KV fp8_e5m2", "bf16", 128, 32, 8, 128, True, torch.float8_e5m2))
FP8_MIN_ARCH = k.FP8_MIN_ARCH


def fake_inputs(dtype: torch.dtype, d: int, hq: int, hkv: int, rot: int, seq_lens: Sequence[int],
                ext_lens: Sequence[int] | None = None, context: int = 4096, slots: int = 4096,
                kv_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """Small CPU tensors with the dtypes and strides the server passes (no values matter); the pool in
    `kv_dtype` (default: the model's)."""
    batch = len(seq_lens)
    tokens = batch if ext_lens is None else sum(ext_lens)
    q = torch.empty(tokens, hq, d, dtype=dtype)
    pool = torch.empty(slots, hkv, d, dtype=kv_dtype or dtype)
    r2t = torch.zeros(batch + 1, context, dtype=torch.int32)  # SGLang's req_to_token is int32
    r2p = torch.zeros_like(r2t)
    idx = torch.arange(batch, dtype=torch.int64)  # req_pool_indices: int64
    lens = torch.tensor(seq_lens, dtype=torch.int64)  # seq_lens: int64
    cos_sin = torch.empty(8192, rot, dtype=torch.float32)
    inv_freq = torch.empty(rot // 2, dtype=torch.float32)
    return q, pool, r2t, r2p, idx, lens, cos_sin, inv_freq


def our_launches(kind: str, dtype: torch.dtype, d: int, hq: int, hkv: int, rot: int, neox: bool, table: bool,
                 arch: int, seq_lens: Sequence[int] = (256, 300), ext_lens: Sequence[int] = (256, 17),
                 context: int = 4096,
                 kv_dtype: torch.dtype | None = None) -> list[Launch]:
    """The launches `decode` / `extend` make for a batch (values only shape split counts and grids)."""
    q, pool, r2t, r2p, idx, lens, cos_sin, inv_freq = fake_inputs(
        dtype, d, hq, hkv, rot, seq_lens, None if kind == "decode" else ext_lens, context, kv_dtype=kv_dtype)
    rope = {} if table else dict(inv_freq=inv_freq, mscale=1.0)
    with target_arch(arch), capture() as launches:
        if kind == "decode":
            k.decode(q, pool, pool, r2t, r2p, idx, lens, lens - 1, cos_sin, rot, neox, d ** -0.5, **rope)
        else:
            ext = torch.tensor(ext_lens, dtype=torch.int32)  # extend_seq_lens: int32
            q_start = torch.cumsum(ext, 0) - ext  # int64, as the backend computes it
            positions = torch.zeros(int(ext.sum()), dtype=torch.int64)
            k.extend(q, pool, pool, r2t, r2p, idx, lens, q_start, ext, positions, cos_sin, rot, neox, d ** -0.5,
                     max(ext_lens), **rope)
    return launches


def configs(arch: int) -> Iterator[dict[str, Any]]:
    fp8 = FP8_MODELS if arch >= FP8_MIN_ARCH else ()
    for model, dtype, d, hq, hkv, rot, neox, kv_dtype in [(*m, None) for m in MODELS] + list(fp8):
        for table in ((False, True) if kv_dtype is None else (False,)):
            rope = "table" if table else "chip"
            for kind in ("decode", "extend"):
                for launch in our_launches(kind, TORCH_DTYPES[dtype], d, hq, hkv, rot, neox, table, arch,
                                           kv_dtype=kv_dtype):
                    name = {"_mepic_decode_kernel": "decode", "_mepic_extend_kernel": "extend",
                            "_merge_kernel": "merge"}[launch.name]
                    if name == "merge" and (table or kind == "extend"):
                        continue  # the same merge for every RoPE source: once per model
                    yield dict(kernel=name, model=model, dtype=dtype, rope="-" if name == "merge" else rope,
                               launch=launch)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80])
    parser.add_argument("--only", choices=("decode", "extend", "merge"))
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter replaces the kernels the compiler needs", file=sys.stderr)
        return 2
    failures = 0
    print("| target | kernel | model | dtype | rope | warps | registers | spill bytes | shared B | compile s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for arch in args.arch:
        for c in configs(arch):
            if args.only and c["kernel"] != args.only:
                continue
            launch = c["launch"]
            label = f"| sm_{arch} | {c['kernel']} | {c['model']} | {c['dtype']} | {c['rope']} | {launch.num_warps} "
            start = time.perf_counter()
            try:
                compiled = compile_launch(launch, arch)
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
