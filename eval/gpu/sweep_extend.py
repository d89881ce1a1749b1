"""Extend launch sweep: which query tile, key tile, warps and pipeline depth run fastest, beside SGLang's extend.

Device machine, with .gpu_carry carried (eval/gpu/make_carry.sh builds it):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 sweep_extend.py [--budget SECONDS] [--json PATH]
CPU check of the script (Triton interpreter, tiny shapes; times meaningless):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 sweep_extend.py --device cpu --tiny

Why: on an H200 (eval/results/gpu/h200.md) fresh prefill ran 1.20x SGLang's extend with the shipped
128 x 32 tile (206 registers, one 8-warp CTA per SM). This times `extend(...)` over block_m x block_n x
num_warps x num_stages, with the split-K count `extend` picks and with none, on the bench's shapes
(Llama-3-8B heads 32/8/128, bf16, shuffled pages of 16, cos/sin on chip): fresh prefill of 2k and 4k,
181 new tokens on 2,197 (the MEPIC shape), 512 new on 8k; and SGLang 0.5.23's `extend_attention_fwd` on the
same pool. Every variant is checked against the first variant's output before it is timed. Timer:
triton.testing.do_bench median (L2 flushed). "default" in the summary is what `extend(...)` launches unasked.
"""

import itertools
import json
import sys

import sweep_setup as setup

args = setup.parse("sweep_extend", 150)
DEV = args.device

import torch  # noqa: E402
import triton  # noqa: E402

import check_kernels as ck  # noqa: E402
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: E402
from sglang_mepic.kernels import attention as K  # noqa: E402

ck.dev = DEV
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float16
D, HQ, HKV = (64, 4, 2) if args.tiny else (128, 32, 8)
CASES = [(64, 64), (96, 16)] if args.tiny else [(4096, 4096), (2048, 2048), (2197, 181), (8192, 512)]
VARIANTS = [dict(block_m=32, block_n=16, num_warps=4, num_stages=1)] if args.tiny else [
    dict(block_m=m, block_n=n, num_warps=w, num_stages=s)
    for m, n, w, s in itertools.product((64, 128), (32, 64), (4, 8), (2, 3))]


def main():
    cache, chip = setup.rope(D, DEV, ck.MAX_POS)
    scale = D ** -0.5
    sms = K.sm_count(DEV)
    info = setup.info(DEV, DTYPE, (HQ, HKV, D), sms)
    cfg = K.launch_config("extend", D, DTYPE, K.device_arch(DEV))
    rows, sgl_ms = [], {}
    for L, E in CASES:
        P = L - E
        kp, vp, r2t, r2p, ri = ck.make_batch([L], [E], HQ, HKV, D, 16, DTYPE, seed=2, identity=True, pool_device=DEV)
        slots = r2t[ri[0].long(), :L].long()
        seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        pos = torch.arange(P, L, dtype=torch.int32, device=DEV)
        q = torch.randn(E, HQ, D, device=DEV, dtype=DTYPE)
        qs = torch.zeros(1, dtype=torch.int32, device=DEV)
        el = torch.tensor([E], dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        kv_end = K.extend_kv_end(r2p, ri, seq, el, pos, L)
        ke, ve = kp[slots[P:]].contiguous(), vp[slots[P:]].contiguous()
        kv_indices = slots[:P] if P else torch.zeros(1, dtype=torch.int64, device=DEV)
        kv_indptr = torch.tensor([0, P], dtype=torch.int32, device=DEV)
        qo_indptr = torch.tensor([0, E], dtype=torch.int32, device=DEV)
        o = torch.empty_like(q)
        sgl_ms[(L, E)] = sgl = setup.timed(lambda: extend_attention_fwd(
            q, ke, ve, o, kp, vp, qo_indptr, kv_indptr, kv_indices, None, True, None, E, 1.0, 1.0, scale,
            extend_seq_lens_cpu=[E]), DEV)
        print(json.dumps(dict(ctx=L, new=E, sglang_ms=round(sgl, 4))), flush=True)
        ref = []
        for v in VARIANTS:
            if setup.spent(args):
                print(f"budget spent: {L}/{E} {v} skipped", flush=True)
                continue
            blocks = triton.cdiv(E, K.extend_tile(HQ // HKV, v["block_m"])[1])
            picked = K.extend_splits(HKV * blocks, L, v["block_n"], cfg["ctas_per_sm"] * sms)
            for splits in sorted({1, picked}):
                def run():
                    return K.extend(q, kp, vp, r2t, r2p, ri, seq, qs, el, pos, cache, D, True, scale, E, out=out,
                                    kv_end=kv_end, max_seq_len=L, splits=splits, **v, **chip)
                try:
                    ms, err = setup.measure(run, ref, DEV)
                except Exception as e:
                    setup.failed(e, ctx=L, new=E, **v, splits=splits)
                    continue
                row = dict(ctx=L, new=E, **v, splits=splits, picked=splits == picked, ms=round(ms, 4),
                           vs_sglang=round(ms / sgl, 3), err=round(err, 5))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del kp, vp, ke, ve
    print("\n## best per case (ours / SGLang)\n")
    for L, E in CASES:
        mine = [r for r in rows if (r["ctx"], r["new"]) == (L, E)]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["ms"])
        default = [r for r in mine if r["picked"] and all(r[k] == cfg[k] for k in
                                                           ("block_m", "block_n", "num_warps", "num_stages"))]
        print(f"{E} new on {L}: best {best['ms']} ms ({best['vs_sglang']}x) block_m {best['block_m']} block_n "
              f"{best['block_n']} warps {best['num_warps']} stages {best['num_stages']} splits {best['splits']}"
              + (f"; default {default[0]['ms']} ms ({default[0]['vs_sglang']}x, splits {default[0]['splits']})"
                 if default else "") + f"; SGLang {round(sgl_ms[(L, E)], 4)} ms")
    setup.write(args, "sweep_extend", info, rows)


if __name__ == "__main__":
    sys.exit(main())
