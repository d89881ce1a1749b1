"""Correctness of the project's Triton attention kernels on a GPU, against the torch path (fp32 reference).

Device machine, with .gpu_carry carried (eval/gpu/make_carry.sh builds it):
    cd .gpu_carry && PYTHONPATH=proj python3 check_kernels.py [--dtypes bf16,fp16,fp32] [--json PATH]
CPU check of the script (Triton interpreter, short sequences; the interpreter takes ieee fp32 dots, so the
bf16/fp16 tensor-core tl.dot path does NOT run there):
    cd .gpu_carry && PYTHONPATH=proj python3 check_kernels.py --device cpu --tiny --dtypes fp16

Cases: 7 head shapes (head dims 64 and 128; GQA groups 1, 3, 4, 7, 8; neox and gptj; partial rotary; pages
of 1 and 16) x dtypes x {decode, extend} x {cos/sin from the table, cos/sin on chip}, plus decode with
forced split counts (1 and 16) on Llama-3-8B heads. Pools hold NoPE keys in shuffled pages, with pad slots
(position -1), gappy positions and the context's slots in random order. The output is poisoned with NaN
first; a case passes if every element was written and max |out - ref| <= tol * (1 + max |ref|)
(tol: fp32 2e-4, fp16 2e-2, bf16 6e-2, as the shared gpu-bench had); the relative L2 error is reported too.
"""

import argparse
import json
import math
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--device", default="cuda")
ap.add_argument("--dtypes", default="bf16,fp16,fp32")
ap.add_argument("--tiny", action="store_true", help="short sequences (for the interpreter)")
ap.add_argument("--json", help="write the rows here (default $OUT/check_kernels.json)")
args = ap.parse_args() if __name__ == "__main__" else ap.parse_args([])
if __name__ == "__main__" and args.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402

from sglang_mepic.attention.reference import attend  # noqa: E402
from sglang_mepic.attention.rope import Rope, cos_sin_cache  # noqa: E402
from sglang_mepic.kernels import attention as K  # noqa: E402

dev = args.device
MAX_POS = 65536
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp8": torch.bfloat16}  # fp8: bf16 queries over an e4m3 pool (issue 73; `fp8_pool`)
FP8_SCALES = (0.5, 2.0)  # k, v: the pool holds the values divided by them, the kernels multiply them back
TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def make_batch(seq_lens, ext_lens, hq, hkv, d, page_size, dtype, seed, pads=True, identity=False, pool_device=None):
    """K/V pools ([slots, Hkv, D]) and a request table. Pages in random order; with identity, slot j of a
    request is at position j; otherwise positions gap by 1 or 2, ~15% of the context slots are pads (-1) and
    the context's slots are permuted (the new tokens stay last, in order). pool_device: draw the pools there
    (the GPU, for big pools)."""
    g = torch.Generator().manual_seed(seed)
    max_len = max(seq_lens)
    ppr = math.ceil(max_len / page_size)
    num_pages = len(seq_lens) * ppr + 3
    order = torch.randperm(num_pages, generator=g)
    if pool_device is not None and pool_device != "cpu":
        gd = torch.Generator(device=pool_device).manual_seed(seed)
        k_pool = torch.randn(num_pages * page_size, hkv, d, generator=gd, device=pool_device, dtype=dtype)
        v_pool = torch.randn(num_pages * page_size, hkv, d, generator=gd, device=pool_device, dtype=dtype)
    else:
        k_pool = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype)
        v_pool = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype)
    rows = len(seq_lens) + 2
    r2t = torch.zeros(rows, max_len + 5, dtype=torch.int32)
    r2p = torch.full((rows, max_len + 5), -1, dtype=torch.int32)
    req_idx = torch.randperm(rows, generator=g)[: len(seq_lens)].to(torch.int32)
    for i, (row, n) in enumerate(zip(req_idx.tolist(), seq_lens)):
        pages = order[i * ppr:(i + 1) * ppr]
        slots = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n]
        r2t[row, :n] = slots.to(torch.int32)
        if identity:
            r2p[row, :n] = torch.arange(n, dtype=torch.int32)
            continue
        pos = torch.cumsum(torch.randint(1, 3, (n,), generator=g), 0) + 3
        if pads:
            is_pad = torch.rand(n, generator=g) < 0.15
            is_pad[-ext_lens[i]:] = False
            pos = torch.where(is_pad, -1, pos)
        perm = torch.cat([torch.randperm(n - ext_lens[i], generator=g), torch.arange(n - ext_lens[i], n)])
        r2t[row, :n] = r2t[row, :n][perm]
        r2p[row, :n] = pos[perm].to(torch.int32)
    return [t.to(dev) for t in (k_pool, v_pool, r2t, r2p, req_idx)]


def reference(q, qpos, k_pool, v_pool, r2t, r2p, req_idx, seq_lens, ext_lens, rope, scale):
    """The torch path (sglang_mepic.attention.reference.attend) in fp32, SDPA's math backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    outs, start = [], 0
    with sdpa_kernel([SDPBackend.MATH]):
        for row, n, e in zip(req_idx.tolist(), seq_lens, ext_lens):
            slots = r2t[row, :n].long()
            outs.append(attend(q[start:start + e].float(), qpos[start:start + e].long(), k_pool[slots].float(),
                               v_pool[slots].float(), r2p[row, :n].long(), rope, scale))
            start += e
    return torch.cat(outs)


CASES = [  # head dim, q heads, kv heads, page size, neox, rotary dim
    (64, 4, 4, 16, True, 64),
    (64, 6, 2, 1, True, 64),
    (128, 8, 2, 16, False, 128),
    (64, 8, 1, 16, True, 32),
    (128, 32, 8, 16, True, 128),   # Llama-3-8B / Mistral-7B
    (128, 28, 4, 16, True, 128),   # Qwen2-7B: group 7
    (64, 9, 3, 16, True, 64),      # SmolLM2-135M
]
LLAMA = CASES[4]


def fp8_pool(kp, vp, r2t, r2p, ri, seq):
    """SGLang's fp8 pool for these values (divided by the scales, cast to e4m3), with every slot no request sees
    (pads, slot 0 and the unused pages) set to NaN in the stored bytes: what another request may leave there.
    Returns the pools and the values they stand for, clean, for the reference."""
    ks, vs = FP8_SCALES
    k8, v8 = (kp.float() / ks).to(torch.float8_e4m3fn), (vp.float() / vs).to(torch.float8_e4m3fn)
    clean_k, clean_v = k8.float() * ks, v8.float() * vs
    seen = torch.zeros(kp.shape[0], dtype=torch.bool, device=kp.device)
    for row, n in zip(ri.tolist(), seq):
        seen[r2t[row, :n][r2p[row, :n] >= 0].long()] = True
    for pool in (k8, v8):
        pool.view(torch.uint8)[~seen] = 0x7F  # e4m3fn's NaN
    return k8, v8, clean_k, clean_v


def run_case(d, hq, hkv, ps, neox, rot, dtype, kind, rope_src, splits_mode, seed, fp8=False):
    table = cos_sin_cache(rot, 4096)
    cache = table.to(dev)
    rope = Rope(cache, rot, d, neox)
    rope_args = {}
    if rope_src == "chip":
        freqs = Rope(table, rot, d, neox).frequencies()
        if freqs is None:
            raise RuntimeError("Rope.frequencies() gave None: no on-chip cos/sin for this cache")
        rope_args = dict(inv_freq=freqs[0].float().contiguous().to(dev), mscale=freqs[1])
    if args.tiny:
        seq, ext = ([9, 40, 3, 150], [1, 1, 1, 1]) if kind == "decode" else ([20, 9, 40, 90], [20, 3, 9, 31])
    else:
        seq, ext = ([37, 70, 5, 1500], [1, 1, 1, 1]) if kind == "decode" else ([40, 21, 70, 900], [40, 5, 17, 300])
    kp, vp, r2t, r2p, ri = make_batch(seq, ext, hq, hkv, d, ps, dtype, seed=seed)
    scaled = {}
    if fp8:
        kp, vp, ref_k, ref_v = fp8_pool(kp, vp, r2t, r2p, ri, seq)
        scaled = dict(k_scale=FP8_SCALES[0], v_scale=FP8_SCALES[1])
    scale = d ** -0.5
    seq_t = torch.tensor(seq, dtype=torch.int32, device=dev)
    info = {}
    g = torch.Generator().manual_seed(seed + 1)
    if kind == "decode":
        qpos = torch.stack([r2p[row, n - 1] for row, n in zip(ri.tolist(), seq)]).to(torch.int32)
        q = rope.rotate(torch.randn(len(seq), hq, d, generator=g).to(dev), qpos.long()).to(dtype)
        out = torch.full((len(seq), hq, d), float("nan"), dtype=dtype, device=dev)
        if splits_mode == "auto":
            ctas = K.decode_ctas_per_sm(q, kp, vp, r2t, r2p, ri, seq_t, qpos, cache, rot, neox, scale, **rope_args) \
                if hasattr(K, "decode_ctas_per_sm") else None  # the capacity of the kernel compiled here
            splits = K.num_kv_splits(seq_t, K.decode_programs_per_split(len(seq), hq, hkv), K.sm_count(dev),
                                     ctas_per_sm=ctas)
        else:
            splits = torch.full((len(seq),), int(splits_mode), dtype=torch.int32, device=dev)
        info["splits"] = splits.tolist()
        K.decode(q, kp, vp, r2t, r2p, ri, seq_t, qpos, cache, rot, neox, scale, out=out, splits=splits, **rope_args,
                 **scaled)
    else:
        qpos = torch.cat([r2p[row, n - e:n] for row, n, e in zip(ri.tolist(), seq, ext)])
        q = rope.rotate(torch.randn(sum(ext), hq, d, generator=g).to(dev), qpos.long()).to(dtype)
        qs = torch.tensor([sum(ext[:i]) for i in range(len(ext))], dtype=torch.int32, device=dev)
        out = torch.full((sum(ext), hq, d), float("nan"), dtype=dtype, device=dev)
        K.extend(q, kp, vp, r2t, r2p, ri, seq_t, qs, torch.tensor(ext, dtype=torch.int32, device=dev), qpos, cache,
                 rot, neox, scale, max(ext), out=out, **rope_args, **scaled)
    if dev == "cuda":
        torch.cuda.synchronize()
    ref = reference(q, qpos, *((ref_k, ref_v) if fp8 else (kp, vp)), r2t, r2p, ri, seq, ext, rope, scale)
    o = out.float()
    unwritten = int(torch.isnan(o).sum())
    err = (o - ref).abs().max().item()
    rel_l2 = ((o - ref).norm() / ref.norm()).item()
    ok = unwritten == 0 and err <= TOL[dtype] * (1 + ref.abs().max().item())
    return dict(max_err=err, rel_l2=rel_l2, nan_or_unwritten=unwritten, ok=ok, **info)


def correctness(dtypes):
    rows = []
    jobs = []
    for name in dtypes:
        if name == "fp8":  # Llama-3-8B's heads and SmolLM2's, each kind, cos/sin on chip
            jobs += [(name, case, kind, "chip", "auto") for case in (LLAMA, CASES[6]) for kind in ("decode", "extend")]
            continue
        for ci, (d, hq, hkv, ps, neox, rot) in enumerate(CASES):
            for kind in ("decode", "extend"):
                for rope_src in ("table", "chip"):
                    jobs.append((name, (d, hq, hkv, ps, neox, rot), kind, rope_src, "auto"))
        for s in ("1", "16"):
            jobs.append((name, LLAMA, "decode", "chip", s))
    for n, (name, case, kind, rope_src, splits_mode) in enumerate(jobs):
        d, hq, hkv, ps, neox, rot = case
        row = dict(kind=kind, dtype=name, d=d, hq=hq, hkv=hkv, page=ps, neox=neox, rot=rot, rope=rope_src,
                   splits=splits_mode)
        t = time.time()
        try:
            row.update(run_case(d, hq, hkv, ps, neox, rot, DTYPES[name], kind, rope_src, splits_mode,
                                seed=1000 * n + d + hq + rot, fp8=name == "fp8"))
        except Exception as e:  # report every failure, go on
            lines = [x for x in str(e).splitlines() if x.strip()]
            row.update(ok=False, error=f"{type(e).__name__}: {lines[-1] if lines else ''}"[:400])
        row["s"] = round(time.time() - t, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    dtypes = [x for x in args.dtypes.split(",") if x]
    info = dict(device=torch.cuda.get_device_name() if dev == "cuda" else "cpu (TRITON_INTERPRET=1)",
                torch=torch.__version__, triton=triton.__version__, dtypes=dtypes, tiny=args.tiny)
    commit = os.path.join(os.path.dirname(K.__file__), "..", "..", "COMMIT")
    info["project_commit"] = open(commit).read().strip() if os.path.exists(commit) else None
    print(json.dumps(info), flush=True)
    t = time.time()
    rows = correctness(dtypes)
    bad = [r for r in rows if not r["ok"]]
    print(f"correctness [{','.join(dtypes)}]: {len(rows) - len(bad)}/{len(rows)} ok in {time.time() - t:.0f} s",
          flush=True)
    for r in bad:
        print("FAILED", json.dumps(r), flush=True)
    path = args.json or os.path.join(os.environ.get("OUT", "."), "check_kernels.json")
    with open(path, "w") as f:
        json.dump(dict(info=info, rows=rows), f, indent=1)
    print("wrote", path)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
