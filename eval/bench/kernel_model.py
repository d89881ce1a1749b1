"""A static performance model of the attention kernels, ours beside SGLang's Triton kernels.

    python -m eval.bench.kernel_model [--arch 90] [--rope default|table|chip]

No GPU needed. Every kernel is compiled the way Triton's launcher compiles it
on the GPU (`sglang_mepic.kernels.aot.compile_launch`: the launch's own
arguments, divisibility specialization, Triton's ptxas), ours from
`decode(...)` / `extend(...)` and SGLang 0.5.23's from `decode_attention_fwd_grouped`
(its grouped stage 1 and stage 2) and `extend_attention_fwd`, with SGLang's
own launch parameters for the architecture (page size 16, SGLang's split
heuristic with its default 8 splits at most).

Per kernel and shape it reports: registers and spills (ptxas -v), shared
memory, CTAs per SM (`kernels.occupancy`: from registers, shared memory and threads on sm_90:
65,536 registers, 228 KB, 2,048 threads, 32 CTAs), programs that do work,
waves over 132 SMs, key tiles per program (the longest program: the critical
path), the inner loop's SASS instructions per tile (nvdisasm: the body from
the loop's label to its backward branch, one thread's static count) and warp
instructions per score element (loop x warps / (rows x keys of a tile)), and
loop warp-instructions over the whole launch (millions): the issue work,
which 132 SMs x 4 schedulers retire at about one per cycle each.

Shapes (the shared gpu-bench ones): Llama-3-8B heads 32/8/128, bf16, page 16;
decode B 1/8/64 at 4k and 32k context; a fresh 2k prefill; the MEPIC shape,
181 new tokens over a 2,197-token context.

A static count, not a timing: on an H100 (eval/results/gpu/after.md) it
mis-ranked the cos/sin sources. It counts fewer SASS per tile with the fp32
table, but the table's per-key gathers cost more than they save: on chip was
faster in 8 of 10 cases, and is the backend's default (`DEFAULT_TABLE_ROPE`).
"""

import argparse
import contextlib
import math
import os
import sys
from dataclasses import dataclass

import torch

from sglang_mepic.kernels import aot
from sglang_mepic.kernels import attention as k
from sglang_mepic.kernels import occupancy

SMS = 132
HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16
PAGE = 16
SGLANG_MAX_KV_SPLITS = 8  # --triton-attention-num-kv-splits default

DECODE_SHAPES = [(b, n) for n in (4096, 32768) for b in (1, 8, 64)]
EXTEND_SHAPES = {"fresh prefill 2k": (2048, 0), "MEPIC 181 over 2,197": (181, 2197 - 181)}


@dataclass
class Row:
    shape: str
    impl: str
    kernel: str
    regs: int
    spills: int
    shared: int
    warps: int
    programs: int
    tiles: int  # key tiles of the longest program
    loop: int  # SASS instructions of the inner loop (one thread, one tile)
    rows: int  # score rows of a tile
    block_n: int
    total_tiles: int  # loop iterations over all programs
    visible_tiles: int = 0  # iterations that see at least one key (extend)

    def ctas_per_sm(self, arch: int = 90) -> int:
        return occupancy.ctas_per_sm(self.regs, self.warps, self.shared, occupancy.SmLimits.of_arch(arch))

    @property
    def per_element(self) -> float:
        return self.loop * self.warps / (self.rows * self.block_n) if self.loop else 0.0

    def waves(self, arch: int = 90) -> float:
        return self.programs / max(1, self.ctas_per_sm(arch) * SMS)


_compiled = {}


def _compile(launch, arch):
    key = (launch.fn.__name__, repr(sorted((kk, str(v)) for kk, v in launch.kwargs.items())),
           tuple(str(getattr(a, "dtype", a)) for a in launch.args), arch)
    if key not in _compiled:
        c = aot.compile_launch(launch, arch)
        regs, spills = aot.ptxas_report(c.asm["ptx"], arch)
        listing = aot.sass(c.asm["cubin"])
        _compiled[key] = (regs, spills, c.metadata.shared, listing)
    return _compiled[key]


def _loop(listing, nth=0):
    lp = aot.inner_loop(listing, nth)
    return lp.size if lp else 0


# ---- ours ----

def our_decode(batch, ctx, arch, table):
    seq = [ctx] * batch
    launches = aot.our_launches("decode", DTYPE, D, HQ, HKV, D, True, table, arch, seq_lens=seq, context=ctx + 16)
    rows = []
    for launch in launches:
        regs, spills, shared, listing = _compile(launch, arch)
        if launch.name == "_merge_kernel":
            rows.append(Row("", "ours", "merge", regs, spills, shared, launch.num_warps,
                            launch.grid[0] * launch.grid[1], 0, 0, 1, 1, 0))
            continue
        splits = launch.args[launch.fn.arg_names.index("NumSplits")]
        bn, bh = launch.constexpr("BLOCK_N"), launch.constexpr("BLOCK_H")
        tiles, programs, total = 0, 0, 0
        for s in splits.tolist():
            per = math.ceil(math.ceil(ctx / s) / bn) * bn
            n = math.ceil(ctx / per)
            programs += n * launch.grid[1]
            tiles = max(tiles, per // bn)
            total += launch.grid[1] * math.ceil(ctx / bn)
        rows.append(Row("", "ours", "decode", regs, spills, shared, launch.num_warps, programs, tiles,
                        _loop(listing), bh, bn, total))
    return rows


def extend_tiles_ours(launch, ext, prefix, identity):
    """(longest program's iterations, all iterations, visible tiles) of our extend, as its loop bounds give them:
    an identity row's block ends at its last query + 1, a planned row's (the MEPIC shape: every slot visible) at
    the request's end; split-K cuts each block's range into whole-tile splits."""
    bn, bm, gp = launch.constexpr("BLOCK_N"), launch.constexpr("BLOCK_M"), launch.constexpr("GROUP_P")
    splits = launch.constexpr("SPLITS")
    tokens = bm // gp
    seq = prefix + ext
    longest = total = visible = programs = 0
    for mblk in range(math.ceil(ext / tokens)):
        end = prefix + min(ext, (mblk + 1) * tokens) if identity else seq
        per_split = math.ceil(math.ceil(end / splits) / bn) * bn
        for s in range(splits):
            lo, hi = s * per_split, min(end, (s + 1) * per_split)
            it = max(0, math.ceil((hi - lo) / bn))
            longest = max(longest, it)
            total += it * HKV
            programs += HKV
        visible += math.ceil(end / bn) * HKV
    return programs, longest, total, visible


def our_extend(ext, prefix, arch, table):
    launches = aot.our_launches("extend", DTYPE, D, HQ, HKV, D, True, table, arch, seq_lens=[prefix + ext],
                                ext_lens=[ext], context=prefix + ext + 16)
    rows = []
    for launch in launches:
        regs, spills, shared, listing = _compile(launch, arch)
        if launch.name == "_merge_kernel":
            rows.append(Row("", "ours", "merge", regs, spills, shared, launch.num_warps,
                            math.prod(launch.grid[:2]), 0, 0, 1, 1, 0))
            continue
        programs, longest, total, visible = extend_tiles_ours(launch, ext, prefix, identity=prefix == 0)
        rows.append(Row("", "ours", f"extend x{launch.constexpr('SPLITS')}", regs, spills, shared, launch.num_warps,
                        programs, longest, _loop(listing), launch.constexpr("BLOCK_M"), launch.constexpr("BLOCK_N"),
                        total, visible))
    return rows


# ---- SGLang's ----

@contextlib.contextmanager
def _sglang_arch(arch):
    from sglang.kernels.ops.attention import extend_attention as ea

    saved = (ea._is_cuda, getattr(ea, "CUDA_CAPABILITY", None))
    ea._is_cuda, ea.CUDA_CAPABILITY = True, (arch // 10, arch % 10)
    try:
        yield ea
    finally:
        ea._is_cuda, ea.CUDA_CAPABILITY = saved


def sglang_splits(seq_lens, num_head=HQ, num_kv_head=HKV, max_splits=SGLANG_MAX_KV_SPLITS, cores=SMS):
    """`get_num_kv_splits_triton` (sglang/kernels/ops/attention/metadata.py), in Python."""
    mx, mn = max(seq_lens), min(seq_lens)
    if mx * 8 < mn * 10:
        mn = mx
    s1 = min(-(-mx // mn), max_splits)
    c1 = -(-mx // s1)
    ext_cores = int(cores * max(math.log2(mx / 64.0), 1.0))
    group = num_head // num_kv_head
    grid = len(seq_lens) * (-(-num_head // min(16, group)) if group > 1 else num_head)
    s2 = min(-(-ext_cores // grid), max_splits)
    c2 = -(-mx // s2)
    return [max(-(-n // c1), -(-n // c2)) for n in seq_lens]


def sglang_decode(batch, ctx, arch):
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd_grouped

    q = torch.empty(batch, HQ, D, dtype=DTYPE)
    pool = torch.empty(4096, HKV, D, dtype=DTYPE)
    o = torch.empty_like(q)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * ctx
    indices = torch.zeros(64, dtype=torch.int64)
    logits = torch.empty(batch, HQ, SGLANG_MAX_KV_SPLITS, D, dtype=torch.float32)
    lse = torch.empty(batch, HQ, SGLANG_MAX_KV_SPLITS, dtype=torch.float32)
    splits = sglang_splits([ctx] * batch)
    with aot.capture() as launches:
        decode_attention_fwd_grouped(q, pool, pool, o, indptr, indices, logits, lse,
                                     torch.tensor(splits, dtype=torch.int32), SGLANG_MAX_KV_SPLITS, D ** -0.5, 1.0,
                                     page_size=PAGE)
    rows = []
    for launch in launches:
        regs, spills, shared, listing = _compile(launch, arch)
        if launch.name == "_fwd_kernel_stage2":
            rows.append(Row("", "SGLang", "stage 2", regs, spills, shared, launch.num_warps,
                            launch.grid[0] * launch.grid[1], 0, 0, 1, 1, 0))
            continue
        bn, bh, min_kv = launch.constexpr("BLOCK_N"), launch.constexpr("BLOCK_H"), launch.constexpr("MIN_BLOCK_KV")
        per = math.ceil(math.ceil(ctx / splits[0]) / min_kv) * min_kv
        n = math.ceil(ctx / per)
        rows.append(Row("", "SGLang", "decode stage 1", regs, spills, shared, launch.num_warps,
                        batch * launch.grid[1] * n, math.ceil(per / bn), _loop(listing), bh, bn,
                        batch * launch.grid[1] * math.ceil(ctx / bn)))
    return rows


def sglang_extend(ext, prefix, arch):
    with _sglang_arch(arch) as ea:
        q = torch.empty(ext, HQ, D, dtype=DTYPE)
        kx = torch.empty(ext, HKV, D, dtype=DTYPE)
        pool = torch.empty(4096, HKV, D, dtype=DTYPE)
        qo = torch.tensor([0, ext], dtype=torch.int64)
        kv = torch.tensor([0, prefix], dtype=torch.int32)
        indices = torch.zeros(max(prefix, 1), dtype=torch.int64)
        with aot.capture() as launches:
            ea.extend_attention_fwd(q, kx, kx, torch.empty_like(q), pool, pool, qo, kv, indices, None, True, None,
                                    ext, 1.0, 1.0, D ** -0.5, page_size=PAGE, extend_seq_lens_cpu=[ext])
    (launch,) = launches
    regs, spills, shared, listing = _compile(launch, arch)
    bm, bn = launch.constexpr("BLOCK_M"), launch.constexpr("BLOCK_N")
    blocks = math.ceil(ext / bm)
    prefix_tiles = math.ceil(prefix / launch.constexpr("BLOCK_N_PREFIX"))
    per_block = [prefix_tiles + math.ceil(min(ext, (m + 1) * bm) / bn) for m in range(blocks)]
    # Two loops (prefix, then the new tokens causally): the larger one's body per tile.
    loop = max(_loop(listing, 0), _loop(listing, 1))
    return [Row("", "SGLang", "extend", regs, spills, shared, launch.num_warps, HQ * blocks, max(per_block), loop,
                bm, bn, HQ * sum(per_block), HQ * sum(per_block))]


def table(arch: int, table_rope: bool) -> list[Row]:
    rows = []
    for b, n in DECODE_SHAPES:
        for r in our_decode(b, n, arch, table_rope) + sglang_decode(b, n, arch):
            r.shape = f"decode B={b} {n // 1024}k"
            rows.append(r)
    for name, (ext, prefix) in EXTEND_SHAPES.items():
        for r in our_extend(ext, prefix, arch, table_rope) + sglang_extend(ext, prefix, arch):
            r.shape = name
            rows.append(r)
    return rows


def render(rows: list[Row], arch: int) -> str:
    out = ["| shape | impl | kernel | regs | spill B | smem KB | warps | CTAs/SM | programs | waves | "
           "tiles/program | loop instr/tile | warp-instr/score | total tiles | visible tiles | loop Mwarp-instr |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        work = r.total_tiles * r.loop * r.warps / 1e6
        out.append(f"| {r.shape} | {r.impl} | {r.kernel} | {r.regs} | {r.spills} | {r.shared / 1024:.1f} | "
                   f"{r.warps} | {r.ctas_per_sm(arch)} | {r.programs} | {r.waves(arch):.2f} | {r.tiles} | "
                   f"{r.loop or '-'} | {r.per_element:.2f} | {r.total_tiles or '-'} | {r.visible_tiles or '-'} | "
                   f"{work:.1f} |")
    return "\n".join(out)


def ratios(rows: list[Row]) -> str:
    """The acceptance figures: ours / SGLang's."""
    lines = []
    by = {}
    for r in rows:
        by.setdefault(r.shape, {})[(r.impl, r.kernel)] = r
    for shape, d in by.items():
        ours = d.get(("ours", "decode")) or next((r for (impl, kern), r in d.items()
                                                   if impl == "ours" and kern.startswith("extend")), None)
        theirs = d.get(("SGLang", "decode stage 1")) or d.get(("SGLang", "extend"))
        if not ours or not theirs:
            continue
        work = (ours.total_tiles * ours.loop * ours.warps) / max(1, theirs.total_tiles * theirs.loop * theirs.warps)
        lines.append(f"| {shape} | {ours.loop / theirs.loop:.2f} | {ours.per_element / theirs.per_element:.2f} | "
                     f"{ours.waves():.2f} / {theirs.waves():.2f} | {ours.tiles} / {theirs.tiles} | {work:.2f} |")
    return "\n".join(["| shape | loop instr/tile ours/SGLang | per score element ours/SGLang | waves ours / SGLang "
                      "| tiles/program ours / SGLang | loop work ours/SGLang |", "|---|---|---|---|---|---|"] + lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--rope", choices=("default", "table", "chip"), default="default",
                        help="our cos/sin source (default: what the backend uses for Llama-3-8B)")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the model compiles the kernels", file=sys.stderr)
        return 2
    table_rope = {"table": True, "chip": False}.get(args.rope, getattr(k, "DEFAULT_TABLE_ROPE", False))
    rows = table(args.arch, table_rope)
    print(f"Static model, sm_{args.arch}, {SMS} SMs; our RoPE cos/sin: {'table' if table_rope else 'on chip'}\n")
    print(render(rows, args.arch))
    print()
    print(ratios(rows))
    ours = [r for r in rows if r.spills and r.impl == "ours"]
    theirs = [r for r in rows if r.spills and r.impl != "ours"]
    print(f"\n{'no kernel of ours spills' if not ours else f'{len(ours)} kernel(s) of ours spill'}"
          f"{f'; SGLang: {len(theirs)} spill' if theirs else ''}")
    return 1 if ours else 0


if __name__ == "__main__":
    sys.exit(main())
