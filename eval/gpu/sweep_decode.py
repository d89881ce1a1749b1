"""Decode launch sweep: which tile, warps, pipeline depth and split count run fastest, beside SGLang's decode.

Device machine, with .gpu_carry carried (eval/gpu/make_carry.sh builds it):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 sweep_decode.py [--budget SECONDS] [--json PATH]
CPU check of the script (Triton interpreter, tiny shapes; times meaningless):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 sweep_decode.py --device cpu --tiny

Why: on an H200 (eval/results/gpu/h200.md) our decode at batch 64, 32k context ran 1.48x SGLang's while
every other decode point was within 1.10x; ncu showed 136 registers, 3 CTAs/SM (18.75% occupancy) and 40%
of DRAM throughput. This sweep led 36d19a8 to 64-key tiles and a recalibrated split rule.

It times `decode(...)` over block_n x num_warps x num_stages x splits (the count `num_kv_splits` picks for
that variant's compiled capacity, and fixed counts) on the bench's shapes (Llama-3-8B heads 32/8/128, bf16,
shuffled pages of 16, cos/sin on chip), and SGLang 0.5.23's `decode_attention_fwd` with its own split
heuristic on the same pool. Every variant is checked against the first variant's output before it is
timed. Timer: triton.testing.do_bench median (L2 flushed). "default" in the summary is what `decode(...)`
launches when not told (`launch_config`, `num_kv_splits`).
"""

import itertools
import json
import sys

import sweep_setup as setup

args = setup.parse("sweep_decode", 240)
DEV = args.device

import torch  # noqa: E402

import check_kernels as ck  # noqa: E402
from sglang_decode import SglangDecode  # noqa: E402
from sglang_mepic.kernels import attention as K  # noqa: E402

ck.dev = DEV
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float16
D, HQ, HKV = (64, 4, 2) if args.tiny else (128, 32, 8)
SMS = K.sm_count(DEV)
CASES = [(2, 256)] if args.tiny else [(64, 32768), (8, 32768), (64, 4096), (1, 32768)]
VARIANTS = [dict(block_n=32, num_warps=4, num_stages=2)] if args.tiny else [
    dict(block_n=bn, num_warps=w, num_stages=s) for bn, w, s in itertools.product((32, 64), (4, 8), (2, 3, 4))]
FIXED_SPLITS = [1, 2] if args.tiny else [1, 2, 3, 4, 6, 8, 12, 16]


def main():
    cache, chip = setup.rope(D, DEV, ck.MAX_POS)
    scale = D ** -0.5
    info = setup.info(DEV, DTYPE, (HQ, HKV, D), SMS)
    rows = []
    for b, L in CASES:
        if setup.spent(args):
            print(f"budget spent: case {b}x{L} skipped", flush=True)
            continue
        kp, vp, r2t, r2p, ri = ck.make_batch([L] * b, [1] * b, HQ, HKV, D, 16, DTYPE, seed=1, identity=True,
                                             pool_device=DEV)
        seq = torch.full((b,), L, dtype=torch.int32, device=DEV)
        qpos = torch.full((b,), L - 1, dtype=torch.int32, device=DEV)
        q = torch.randn(b, HQ, D, device=DEV, dtype=DTYPE)
        ws = K.DecodeWorkspace(b, HQ, D, DEV)
        out = torch.empty(b, HQ, D, device=DEV, dtype=DTYPE)
        # SGLang's decode on the same pool (slot lists as its kv_indices), its own split heuristic.
        sglang = SglangDecode(q, kp, vp, r2t[ri.long(), :L].long(), seq, SMS, scale)
        sgl = setup.timed(sglang, DEV)
        print(json.dumps(dict(batch=b, ctx=L, sglang_ms=round(sgl, 4), sglang_splits=int(sglang.splits[0]),
                              sglang_pdl=sglang.pdl)), flush=True)
        ref = []
        for v in VARIANTS:
            if setup.spent(args):
                break
            tensors = (q, kp, vp, r2t, r2p, ri, seq, qpos, cache)
            try:
                ctas = K.decode_ctas_per_sm(*tensors, D, True, scale, workspace=ws, **v, **chip)
            except Exception as e:
                setup.failed(e, batch=b, ctx=L, **v)
                continue
            picked = K.whole_wave_splits(K.decode_programs_per_split(b, HQ, HKV), SMS * ctas)
            for s in sorted(set(FIXED_SPLITS) | {picked}):
                splits = K.num_kv_splits(seq, K.decode_programs_per_split(b, HQ, HKV), SMS, ctas_per_sm=ctas) \
                    if s == picked else torch.full((b,), s, dtype=torch.int32, device=DEV)
                if s != picked and (L + s - 1) // s < 32:
                    continue

                def run():
                    return K.decode(*tensors, D, True, scale, out=out, splits=splits, workspace=ws, **v, **chip)
                try:
                    ms, err = setup.measure(run, ref, DEV)
                except Exception as e:
                    setup.failed(e, batch=b, ctx=L, **v, splits=s)
                    continue
                row = dict(batch=b, ctx=L, **v, ctas_per_sm=ctas, splits=int(splits[0]), picked=s == picked,
                           ms=round(ms, 4), vs_sglang=round(ms / sgl, 3), err=round(err, 5))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print("\n## best per case (ours / SGLang)\n")
    for b, L in CASES:
        mine = [r for r in rows if r["batch"] == b and r["ctx"] == L]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["ms"])
        cfg = K.launch_config("decode", D, DTYPE, K.device_arch(DEV))  # what decode(...) launches unasked
        default = [r for r in mine if r["picked"] and (r["block_n"], r["num_warps"], r["num_stages"]) ==
                   (cfg["block_n"], cfg["num_warps"], cfg["num_stages"])]
        print(f"B={b} ctx={L}: best {best['ms']} ms ({best['vs_sglang']}x) block_n {best['block_n']} warps "
              f"{best['num_warps']} stages {best['num_stages']} splits {best['splits']} ctas/SM {best['ctas_per_sm']}"
              + (f"; default {default[0]['ms']} ms ({default[0]['vs_sglang']}x, splits {default[0]['splits']})"
                 if default else ""))
    setup.write(args, "sweep_decode", info, rows)


if __name__ == "__main__":
    sys.exit(main())
