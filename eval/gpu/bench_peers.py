"""Our Triton attention vs SGLang's own (`--attention-backend triton`) vs FlashAttention, on the same paged pools.

Device machine, with .gpu_carry carried (eval/gpu/make_carry.sh builds it):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 bench_peers.py [--quick] [--graph] [--json PATH]
CPU check of the script (Triton interpreter, tiny shapes, fp16, SDPA math backend; times meaningless):
    cd .gpu_carry && PYTHONPATH=proj:sgl python3 bench_peers.py --device cpu --tiny

Shapes: Llama-3-8B heads (32 query, 8 kv, head dim 128), bf16, pages of 16 slots in random order, slot j of
a request at position j. Decode: batch 1/8/64 at 4k and 32k context. Extend: fresh prefill of 2k and 4k;
181 new tokens over a 2,197-token context (the MEPIC shape); 512 new tokens on an 8k context.

"ours" is `decode(...)` with `num_kv_splits` / `DecodeWorkspace` made outside the timed region (as the
backend does for CUDA graphs) and cos/sin computed on chip from `Rope.frequencies()` (the backend with
MEPIC_ROPE_ON_CHIP=1); "ours_table" is the same with cos/sin read from the fp32 table (the backend's default). Where the extend API
takes `kv_end` / `max_seq_len`, they are computed outside the timed region too. "sglang" is SGLang
0.5.23's `decode_attention_fwd` (max 8 splits, per-request count from its `get_num_kv_splits_triton`, PDL on
sm90 as its triton backend launches it) and `extend_attention_fwd` (prefix through kv_indices, new tokens'
K/V contiguous). "flash" is torch SDPA (flash; efficient for the bottom-right causal mask of an extend
with a prefix) on contiguous, pre-rotated K/V: no paging, no RoPE. SGLang's kernels and flash read keys
already rotated, ours rotate NoPE keys in the kernel: each system is checked against fp32 SDPA (math) of its
own semantics on the same pool (the first 4 requests / the first and last 64 query rows) before it is
timed; a failed check is reported in the table (and the time kept, marked).
Timer: triton.testing.do_bench (median; it flushes L2 before each call), or do_bench_cudagraph with --graph.
"""

import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--tiny", action="store_true", help="tiny shapes (4 q heads, 2 kv heads, head dim 64)")
ap.add_argument("--quick", action="store_true", help="a smaller grid")
ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays (do_bench_cudagraph)")
ap.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                help="default bfloat16; float16 on cpu (the interpreter takes fp32 dots there anyway)")
ap.add_argument("--json", help="default $OUT/bench_peers[_graph].json")
args = ap.parse_args()
DEV = args.device
if DEV == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

import check_kernels as ck  # noqa: E402
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd  # noqa: E402
from sglang_mepic.attention.rope import Rope, cos_sin_cache  # noqa: E402
from sglang_mepic.kernels import attention as K  # noqa: E402
from sglang_decode import PDL, SglangDecode  # noqa: E402

ck.dev = DEV
DTYPE = getattr(torch, args.dtype or ("bfloat16" if DEV == "cuda" else "float16"))
D, HQ, HKV = (64, 4, 2) if args.tiny else (128, 32, 8)
PAGE = 16
SMS = K.sm_count(DEV)


def timed(fn, rep):
    if DEV != "cuda":  # interpreter: one call, only to show it runs
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench, do_bench_cudagraph

    if args.graph:
        return do_bench_cudagraph(fn, rep=rep, return_mode="median")
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def ref_attn(q, k, v, qpos, scale):
    """fp32 SDPA (math) of q [n, Hq, D] at positions qpos [n] over k, v [L, Hkv, D] at positions 0..L-1."""
    mask = torch.arange(k.shape[0], device=q.device) <= qpos.view(-1, 1)
    with sdpa_kernel([SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(
            *(t.float().transpose(0, 1) for t in (q, k, v)), attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(0, 1)


def measure(row, name, fn, pick, ref, rep):
    """Run fn once, compare pick(output) with ref (check_kernels' tolerance), then time fn."""
    try:
        out = pick(fn()).float()
        err = (out - ref).abs().max().item()
        ok = bool(torch.isfinite(out).all()) and err <= ck.TOL[DTYPE] * (1 + ref.abs().max().item())
        row["check"][name] = dict(max_err=round(err, 5), rel_l2=round(((out - ref).norm() / ref.norm()).item(), 6),
                                  ok=ok)
        row["ms"][name] = round(timed(fn, rep), 4)
    except Exception as e:  # report it, go on with the others
        lines = [x for x in str(e).splitlines() if x.strip()]
        row["check"][name] = dict(ok=False, error=f"{type(e).__name__}: {lines[-1] if lines else ''}"[:300])
        row["ms"][name] = float("nan")


def sdpa(q, k, v, backends, is_causal=False, mask=None):
    with sdpa_kernel(backends if DEV == "cuda" else [SDPBackend.MATH]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                enable_gqa=True)


# Our kernels over an fp8 pool (issue 73): check_kernels' e4m3 pool of the same keys and values (its scales, its
# hidden slots NaN), checked against attention over those fp8 values, timed beside the bf16 pool ("ours").
FP8, FP8_SCALES = getattr(torch, "float8_e4m3fn", None), ck.FP8_SCALES


def rope_setup():
    table = cos_sin_cache(D, ck.MAX_POS)
    rope = Rope(table.to(DEV), D, D, True)
    freqs = Rope(table, D, D, True).frequencies()
    chip = {} if freqs is None else dict(inv_freq=freqs[0].float().contiguous().to(DEV), mscale=freqs[1])
    return rope, chip


def bench_decode(grid, rope, chip):
    scale, res = D ** -0.5, []
    cache = rope.cos_sin_cache
    for b, L in grid:
        kp, vp, r2t, r2p, ri = ck.make_batch([L] * b, [1] * b, HQ, HKV, D, PAGE, DTYPE, seed=1, identity=True,
                                             pool_device=DEV)
        seq = torch.full((b,), L, dtype=torch.int32, device=DEV)
        qpos = torch.full((b,), L - 1, dtype=torch.int32, device=DEV)
        q = torch.randn(b, HQ, D, device=DEV, dtype=DTYPE)
        slots = r2t[ri.long(), :L].long()  # [b, L]: each request's slot list (page size 1 for SGLang)
        n = min(b, 4)  # requests checked
        ref_pre = torch.cat([ref_attn(q[i:i + 1], kp[slots[i]], vp[slots[i]], qpos[i:i + 1], scale) for i in range(n)])
        ref_rot = torch.cat([ref_attn(q[i:i + 1], rope.rotate(kp[slots[i]].float()), vp[slots[i]], qpos[i:i + 1],
                                      scale) for i in range(n)])
        row = dict(kind="decode", batch=b, ctx=L, ms={}, check={})
        # Splits for the capacity of the decode kernel compiled here (the on-chip variant's, the backend's).
        ctas = K.decode_ctas_per_sm(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, D, True, scale, **chip) \
            if hasattr(K, "decode_ctas_per_sm") else None
        splits = K.num_kv_splits(seq, K.decode_programs_per_split(b, HQ, HKV), SMS, ctas_per_sm=ctas)
        row["our_ctas_per_sm"] = ctas
        ws = K.DecodeWorkspace(b, HQ, D, DEV)
        out = torch.empty(b, HQ, D, device=DEV, dtype=DTYPE)
        row["our_splits"] = int(splits[0])
        row["our_grid"] = [b, HKV * K.decode_tiles(HQ // HKV)[1], ws.max_splits]
        measure(row, "ours", lambda: K.decode(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, D, True, scale, out=out,
                                              splits=splits, workspace=ws, **chip), lambda o: o[:n], ref_rot, 100)
        measure(row, "ours_table", lambda: K.decode(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, D, True, scale,
                                                    out=out, splits=splits, workspace=ws),
                lambda o: o[:n], ref_rot, 100)
        if FP8 is not None:
            k8, v8, kf, vf = ck.fp8_pool(kp, vp, r2t, r2p, ri, [L] * b)
            ref8 = torch.cat([ref_attn(q[i:i + 1], rope.rotate(kf[slots[i]]), vf[slots[i]], qpos[i:i + 1], scale)
                              for i in range(n)])
            measure(row, "ours_fp8", lambda: K.decode(q, k8, v8, r2t, r2p, ri, seq, qpos, cache, D, True, scale,
                                                      out=out, splits=splits, workspace=ws, k_scale=FP8_SCALES[0],
                                                      v_scale=FP8_SCALES[1], **chip), lambda o: o[:n], ref8, 100)
            del k8, v8, kf, vf
        sglang = SglangDecode(q, kp, vp, slots, seq, SMS, scale)
        if sglang.note:
            row["sglang_splits_note"] = sglang.note
        row["sglang_splits"] = int(sglang.splits[0])
        measure(row, "sglang", sglang, lambda o: o[:n], ref_pre, 100)
        row["sglang_pdl"] = sglang.pdl
        kc, vc = (p[slots].transpose(1, 2).contiguous() for p in (kp, vp))  # [b, Hkv, L, D]
        qc = q.view(b, HQ, 1, D)
        measure(row, "flash", lambda: sdpa(qc, kc, vc, [SDPBackend.FLASH_ATTENTION]), lambda o: o[:n, :, 0],
                ref_pre, 100)
        kv_bytes = 2 * b * L * HKV * D * DTYPE.itemsize
        row["kv_bytes"] = kv_bytes
        row["TBps"] = {k: round(kv_bytes / v / 1e9, 3) for k, v in row["ms"].items() if v == v}
        del kp, vp, kc, vc, sglang  # it holds the pools too
        finish(row, res)
    return res


def bench_extend(grid, rope, chip):
    scale, res = D ** -0.5, []
    cache = rope.cos_sin_cache
    for L, E in grid:  # context, new tokens (the last E slots)
        P = L - E
        kp, vp, r2t, r2p, ri = ck.make_batch([L], [E], HQ, HKV, D, PAGE, DTYPE, seed=2, identity=True,
                                             pool_device=DEV)
        slots = r2t[ri[0].long(), :L].long()
        seq = torch.tensor([L], dtype=torch.int32, device=DEV)
        pos = torch.arange(P, L, dtype=torch.int32, device=DEV)
        q = torch.randn(E, HQ, D, device=DEV, dtype=DTYPE)
        rows = torch.unique(torch.cat([torch.arange(min(E, 64)), torch.arange(max(0, E - 64), E)])).to(DEV)
        ref_pre = ref_attn(q[rows], kp[slots], vp[slots], P + rows, scale)
        ref_rot = ref_attn(q[rows], rope.rotate(kp[slots].float()), vp[slots], P + rows, scale)
        row = dict(kind="extend", ctx=L, new=E, ms={}, check={})
        qs = torch.zeros(1, dtype=torch.int32, device=DEV)
        el = torch.tensor([E], dtype=torch.int32, device=DEV)
        out = torch.empty_like(q)
        cfg = K.launch_config("extend", D, DTYPE, K.device_arch(DEV))
        gp, per = K.extend_tile(HQ // HKV, cfg["block_m"])
        blocks = triton.cdiv(E, per)
        ksplits = K.extend_splits(HKV * blocks, L, cfg["block_n"], cfg["ctas_per_sm"] * SMS) \
            if hasattr(K, "extend_splits") else 1  # split-K extend, where the kernels have it
        row["our_grid"] = [1, HKV * ksplits, blocks]
        # Per-forward metadata outside the timed region, as for decode's splits (and no host sync inside,
        # so the call can be captured in a CUDA graph): kv_end / max_seq_len where the kernel API has them.
        ext_kw = dict(kv_end=K.extend_kv_end(r2p, ri, seq, el, pos, L), max_seq_len=L) \
            if hasattr(K, "extend_kv_end") else {}
        measure(row, "ours", lambda: K.extend(q, kp, vp, r2t, r2p, ri, seq, qs, el, pos, cache, D, True, scale, E,
                                              out=out, **ext_kw, **chip), lambda o: o[rows], ref_rot, 100)
        measure(row, "ours_table", lambda: K.extend(q, kp, vp, r2t, r2p, ri, seq, qs, el, pos, cache, D, True,
                                                    scale, E, out=out, **ext_kw), lambda o: o[rows], ref_rot, 100)
        if FP8 is not None:
            k8, v8, kf, vf = ck.fp8_pool(kp, vp, r2t, r2p, ri, [L])
            ref8 = ref_attn(q[rows], rope.rotate(kf[slots]), vf[slots], P + rows, scale)
            measure(row, "ours_fp8", lambda: K.extend(q, k8, v8, r2t, r2p, ri, seq, qs, el, pos, cache, D, True,
                                                      scale, E, out=out, k_scale=FP8_SCALES[0],
                                                      v_scale=FP8_SCALES[1], **ext_kw, **chip),
                    lambda o: o[rows], ref8, 100)
            del k8, v8, kf, vf
        # SGLang's forward_extend: prefix through kv_indices into the pool, the new tokens' K/V contiguous.
        ke, ve = kp[slots[P:]].contiguous(), vp[slots[P:]].contiguous()
        kv_indices = slots[:P] if P else torch.zeros(1, dtype=torch.int64, device=DEV)
        kv_indptr = torch.tensor([0, P], dtype=torch.int32, device=DEV)
        qo_indptr = torch.tensor([0, E], dtype=torch.int32, device=DEV)
        o = torch.empty_like(q)

        def sgl():
            extend_attention_fwd(q, ke, ve, o, kp, vp, qo_indptr, kv_indptr, kv_indices, None, True, None, E, 1.0,
                                 1.0, scale, extend_seq_lens_cpu=[E])
            return o
        measure(row, "sglang", sgl, lambda o: o[rows], ref_pre, 100)
        kc, vc = (p[slots].transpose(0, 1).unsqueeze(0).contiguous() for p in (kp, vp))
        qc = q.transpose(0, 1).unsqueeze(0)
        mask = None if E == L else causal_lower_right(E, L)
        measure(row, "flash", lambda: sdpa(qc, kc, vc, [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
                                           is_causal=E == L, mask=mask), lambda o: o[0].transpose(0, 1)[rows],
                ref_pre, 100)
        flops = 4 * HQ * D * (E * P + E * (E + 1) / 2)  # causal: query i of E sees P + i + 1 keys
        row["TFLOPs"] = {k: round(flops / v / 1e9, 1) for k, v in row["ms"].items() if v == v}
        del kp, vp, kc, vc, ke, ve
        finish(row, res)
    return res


def finish(row, res):
    print(json.dumps(row), flush=True)
    res.append(row)
    if DEV == "cuda":
        torch.cuda.empty_cache()


def table(info, rows):
    def r2(a, b):
        return f"{a / b:.2f}" if a == a and b == b and b > 0 else "n/a"

    lines = [f"\n## {info['device']}: ms ({info['timer']}), {info['dtype']}, heads {HQ}/{HKV}/{D}, pages of {PAGE}, "
             f"project {info['project_commit']}\n",
             "| case | ours | ours (cos/sin table) | ours, fp8 e4m3 KV | SGLang triton | flash (SDPA) | ours / SGLang "
             "| ours / flash | ours fp8 / ours | checks |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        case = (f"decode, batch {r['batch']}, context {r['ctx']}" if r["kind"] == "decode"
                else f"{r['new']} new tokens on {r['ctx']} context" if r["new"] != r["ctx"]
                else f"prefill {r['ctx']} (fresh)")
        ms = r["ms"]
        bad = [k for k, c in r["check"].items() if not c["ok"]]
        fp8 = ms.get("ours_fp8", float("nan"))
        lines.append(f"| {case} | {ms['ours']:.4f} | {ms['ours_table']:.4f} | {fp8:.4f} | {ms['sglang']:.4f} | "
                     f"{ms['flash']:.4f} | {r2(ms['ours'], ms['sglang'])} | {r2(ms['ours'], ms['flash'])} | "
                     f"{r2(fp8, ms['ours'])} | {'ok' if not bad else 'FAILED: ' + ', '.join(bad)} |")
    return "\n".join(lines)


def main():
    commit = os.path.join(os.path.dirname(K.__file__), "..", "..", "COMMIT")
    info = dict(device=torch.cuda.get_device_name() if DEV == "cuda" else "cpu (TRITON_INTERPRET=1, times meaningless)",
                torch=torch.__version__, triton=triton.__version__, sglang_kernels="0.5.23 (.gpu_carry/sgl)",
                project_commit=open(commit).read().strip() if os.path.exists(commit) else None,
                timer="none (interpreter)" if DEV != "cuda" else "do_bench_cudagraph median" if args.graph
                else "do_bench median", dtype=str(DTYPE).split(".")[-1], heads=[HQ, HKV, D], page=PAGE, sms=SMS,
                our_launch=dict(decode=K.launch_config("decode", D, DTYPE, K.device_arch(DEV)),
                                extend=K.launch_config("extend", D, DTYPE, K.device_arch(DEV))))
    rope, chip = rope_setup()
    info["our_rope"] = "chip (Rope.frequencies)" if chip else "table (frequencies() gave None)"
    print(json.dumps(info), flush=True)
    if args.tiny:
        dgrid, egrid = [(2, 64), (1, 200)], [(64, 64), (96, 32), (60, 11)]
    elif args.quick:
        dgrid = [(1, 4096), (8, 4096), (64, 4096), (8, 32768)]
        egrid = [(4096, 4096), (2197, 181), (8192, 512)]
    else:
        dgrid = [(1, 4096), (8, 4096), (64, 4096), (1, 32768), (8, 32768), (64, 32768)]
        egrid = [(2048, 2048), (4096, 4096), (2197, 181), (8192, 512)]
    out = dict(info=info, decode=bench_decode(dgrid, rope, chip), extend=bench_extend(egrid, rope, chip))
    info["sglang_decode_pdl"] = PDL[0]
    bad = [(r["kind"], r.get("batch", r.get("new")), r["ctx"], k) for r in out["decode"] + out["extend"]
           for k, c in r["check"].items() if not c["ok"]]
    print(f"checks: {'all ok' if not bad else f'FAILED {bad}'}", flush=True)
    text = table(info, out["decode"] + out["extend"])
    out["table"] = text
    path = args.json or os.path.join(os.environ.get("OUT", "."),
                                     "bench_peers_graph.json" if args.graph else "bench_peers.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(text, flush=True)
    print("\nwrote", path)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
