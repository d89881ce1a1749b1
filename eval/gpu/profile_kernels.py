"""Registers, spills and launch shape of the project's kernels on the GPU; the launches ncu profiles.

    cd .gpu_carry && PYTHONPATH=proj python3 profile_kernels.py [--json PATH]
    cd .gpu_carry && PYTHONPATH=proj ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
        -k regex:_mepic_ --launch-count 4 python3 profile_kernels.py --once

Shapes (Llama-3-8B heads 32/8/128, bf16, pages of 16, cos/sin on chip as the backend runs them), launched in
this order (with --rope both: all four with cos/sin on chip, then all four from the table), each once with --once: decode batch 8 at 4k context, decode batch 64 at 4k, extend of 181 new
tokens over 2,197 (the MEPIC shape), extend of 512 new on 8k. Without --once each is launched 3 times
first (to compile) and the compiled kernels' registers and local-memory (spill) bytes per thread are read
from Triton (CompiledKernel.n_regs / n_spills, which the driver reports), with counts of the tensor-core
instructions in the PTX (wgmma.mma_async on sm_90, mma.sync otherwise).
"""

import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--once", action="store_true", help="one launch per shape (under ncu)")
ap.add_argument("--rope", choices=("chip", "table", "both"), default="chip",
                help="cos/sin on chip (what the backend launches), from the table, or both (chip first)")
ap.add_argument("--device", default="cuda", help="cpu: tiny shapes under the interpreter, to check the script")
ap.add_argument("--json")
args = ap.parse_args()
if args.device == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402

import check_kernels as ck  # noqa: E402
from sglang_mepic.attention.rope import Rope, cos_sin_cache  # noqa: E402
from sglang_mepic.kernels import attention as K  # noqa: E402

dev = ck.dev = args.device
CPU = dev == "cpu"
d, hq, hkv, dtype = 128, 32, 8, torch.bfloat16
table = cos_sin_cache(d, 65536)
cache = table.to(dev)
freqs = Rope(table, d, d, True).frequencies()
chip = {} if freqs is None else dict(inv_freq=freqs[0].float().contiguous().to(dev), mscale=freqs[1])
scale = d ** -0.5
sms = K.sm_count(dev)
launches, shapes = [], []

for b, L in ((2, 64), (4, 300)) if CPU else ((8, 4096), (64, 4096)):
    kp, vp, r2t, r2p, ri = ck.make_batch([L] * b, [1] * b, hq, hkv, d, 16, dtype, seed=1, identity=True,
                                         pool_device=dev)
    seq = torch.full((b,), L, dtype=torch.int32, device=dev)
    qpos = torch.full((b,), L - 1, dtype=torch.int32, device=dev)
    q = torch.randn(b, hq, d, device=dev, dtype=dtype)
    ctas = K.decode_ctas_per_sm(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, d, True, scale, **chip) \
        if hasattr(K, "decode_ctas_per_sm") else None  # the capacity of the kernel compiled here
    splits = K.num_kv_splits(seq, K.decode_programs_per_split(b, hq, hkv), sms, ctas_per_sm=ctas)
    ws = K.DecodeWorkspace(b, hq, d, dev)
    block_h, tiles = K.decode_tiles(hq // hkv)
    s = int(splits[0])
    shapes.append(dict(kernel="decode", batch=b, ctx=L, splits=s, grid=[b, hkv * tiles, ws.max_splits],
                       live_programs=b * hkv * tiles * s, block_h=block_h, sms=sms, ctas_per_sm=ctas))
    launches.append(lambda q=q, kp=kp, vp=vp, r2t=r2t, r2p=r2p, ri=ri, seq=seq, qpos=qpos, splits=splits, ws=ws, **rope:
                    K.decode(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, d, True, scale, splits=splits, workspace=ws,
                             **rope))

for L, E in ((60, 11), (96, 32)) if CPU else ((2197, 181), (8192, 512)):
    kp, vp, r2t, r2p, ri = ck.make_batch([L], [E], hq, hkv, d, 16, dtype, seed=2, identity=True, pool_device=dev)
    pos = torch.arange(L - E, L, dtype=torch.int32, device=dev)
    q = torch.randn(E, hq, d, device=dev, dtype=dtype)
    a = (q, kp, vp, r2t, r2p, ri, torch.tensor([L], dtype=torch.int32, device=dev),
         torch.zeros(1, dtype=torch.int32, device=dev), torch.tensor([E], dtype=torch.int32, device=dev), pos, cache,
         d, True, scale, E)
    cfg = K.launch_config("extend", d, dtype, K.device_arch(dev))
    gp, per = K.extend_tile(hq // hkv, cfg["block_m"])
    blocks = triton.cdiv(E, per)
    ksplits = K.extend_splits(hkv * blocks, L, cfg["block_n"], cfg["ctas_per_sm"] * sms) \
        if hasattr(K, "extend_splits") else 1  # split-K extend, where the kernels have it
    shapes.append(dict(kernel="extend", ctx=L, new=E, grid=[1, hkv * ksplits, blocks], splits=ksplits,
                       programs=hkv * ksplits * blocks, rows_per_program=gp * per, tokens_per_program=per,
                       sms=sms, **{k: v for k, v in cfg.items()}))
    ext_kw = dict(kv_end=K.extend_kv_end(r2p, ri, a[6], a[8], pos, L), max_seq_len=L) \
        if hasattr(K, "extend_kv_end") else {}  # as bench_peers: per-forward metadata made outside
    launches.append(lambda a=a, ext_kw=ext_kw, **rope: K.extend(*a, **ext_kw, **rope))

KERNELS = (("decode", K._mepic_decode_kernel), ("merge", K._merge_kernel), ("extend", K._mepic_extend_kernel))


def compiled_now():
    return {(name, key): kern for name, fn in KERNELS for cache_tuple in getattr(fn, "device_caches", {}).values()
            for key, kern in cache_tuple[0].items()}


compiled, seen = [], set()
for rope_name in ("chip", "table") if args.rope == "both" else (args.rope,):
    for fn in launches:
        for _ in range(1 if args.once else 3):
            fn(**(chip if rope_name == "chip" else {}))
    if not CPU:
        torch.cuda.synchronize()
    for (name, key), kern in compiled_now().items():
        if (name, key) in seen:
            continue
        seen.add((name, key))
        md = kern.metadata
        ptx = getattr(kern, "asm", {}).get("ptx", "")
        # Triton's n_spills is the driver's local memory per thread / 4 (driver.c): spills or a stack frame.
        compiled.append(dict(kernel=name, rope=rope_name if name != "merge" else "-", n_regs=kern.n_regs,
                             n_spills=kern.n_spills, local_bytes_per_thread=4 * kern.n_spills,
                             shared_bytes=md.shared, num_warps=md.num_warps, num_stages=md.num_stages,
                             ptx_wgmma=ptx.count("wgmma.mma_async"), ptx_mma_sync=ptx.count("mma.sync"),
                             ptx_local_ld_st=ptx.count("ld.local") + ptx.count("st.local")))
for r in compiled + shapes:
    print(json.dumps(r), flush=True)
if not args.once:
    path = args.json or os.path.join(os.environ.get("OUT", "."), "profile_kernels.json")
    with open(path, "w") as f:
        json.dump(dict(device="cpu (interpreter)" if CPU else torch.cuda.get_device_name(), triton=triton.__version__,
                       compiled=compiled, shapes=shapes), f, indent=1)
    print("wrote", path)
sys.exit(0)
