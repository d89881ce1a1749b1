"""Attention cost of the mepic backend: on CPU against SGLang's torch_native, on a GPU against SGLang's Triton.

    .venv/bin/python eval/bench/attention.py [--repeat 5] [--contexts 1024,4096]   # CPU
    python eval/bench/attention.py --device cuda [--quick] [--graph] [--rope chip|table]

CPU. Part 1 times the backends' own code paths (SmolLM2-135M shapes: 9 query
heads, 3 kv heads, head dim 64; fp32) for prefill and decode at 1k and 4k context
and prints mepic / torch_native. Part 2 runs each Triton kernel under
TRITON_INTERPRET=1 and prints its max error against the torch path.

GPU (`--device cuda`). Our kernels against SGLang's `--attention-backend
triton` kernels (`decode_attention_fwd` with its own split heuristic,
`extend_attention_fwd`, imported from the installed sglang) and FlashAttention
(torch SDPA flash on contiguous, pre-rotated K/V), on the shape grid of the
shared gpu-bench: Llama-3-8B heads (32/8/128), bf16, pages of 16 slots in random
order. SGLang reads keys already rotated, ours rotate NoPE keys in the kernel;
each system is checked against fp32 SDPA of its own semantics before it is
timed, and a system that fails its check is reported, not timed. One table,
plus JSON under $OUT (or .) as bench_attention_gpu.json.
`--device cpu --peers --tiny` runs that GPU comparison under the interpreter,
to check the script without a GPU.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time
from types import SimpleNamespace

if not any(a in ("cuda", "--device=cuda") for a in sys.argv[1:]):  # on CUDA the kernels compile
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

import torch  # noqa: E402

from sglang_mepic.attention.backend import MepicAttnBackend  # noqa: E402
from sglang_mepic.attention.rope import Rope, cos_sin_cache  # noqa: E402

HQ, HKV, D = 9, 3, 64


def setup(batch, ctx, new_tokens, seed=0):
    g = torch.Generator().manual_seed(seed)
    slots = batch * ctx + 16
    k = torch.randn(slots, HKV, D, generator=g)
    v = torch.randn(slots, HKV, D, generator=g)
    req_to_token = torch.zeros(batch + 1, ctx + 8, dtype=torch.int32)
    for b in range(batch):
        req_to_token[b, :ctx] = torch.arange(b * ctx, (b + 1) * ctx, dtype=torch.int32)
    rows = torch.arange(batch)
    seq_lens = torch.full((batch,), ctx)
    prefix = torch.full((batch,), ctx - new_tokens)
    ext = torch.full((batch,), new_tokens)
    positions = torch.cat([torch.arange(ctx - new_tokens, ctx)] * batch)
    q = torch.randn(batch * new_tokens, HQ * D, generator=g)
    return SimpleNamespace(k=k, v=v, req_to_token=req_to_token, rows=rows, seq_lens=seq_lens, prefix=prefix,
                           ext=ext, positions=positions, q=q)


def mepic_fn(s, rope, decode, general=False):
    backend = MepicAttnBackend.over_pools(s.req_to_token, s.k, s.v, rope)
    layer = SimpleNamespace(tp_q_head_num=HQ, qk_head_dim=D, v_head_dim=D, layer_id=0, scaling=D ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    if decode:
        # As in serving: the prompt's extend fills slots 0..ctx-2, then the decode step writes the
        # newest token's slot (for a planned row, at the position after the row's last one).
        prompt = torch.cat([torch.arange(int(n)) for n in s.prefix])
        backend.positions.on_extend(s.rows, torch.zeros_like(s.prefix), s.prefix, prompt)
    else:
        backend.positions.on_extend(s.rows, s.prefix, s.ext, s.positions)  # the rows' positions: 0..ctx-1
    if general:
        # Force the general path chunked requests take: positions read from the map.
        backend.positions.planned[:] = True
    mode = SimpleNamespace(is_decode=lambda: decode, is_extend=lambda: not decode)
    fb = SimpleNamespace(req_pool_indices=s.rows, seq_lens=s.seq_lens, positions=s.positions, batch_size=len(s.rows),
                         extend_prefix_lens=s.prefix, extend_seq_lens=s.ext, forward_mode=mode, out_cache_loc=None)
    backend.init_forward_metadata(fb)
    q_lens = [1] * len(s.rows) if decode else s.ext.tolist()
    if not decode:
        return lambda: backend._run(s.q, layer, fb, q_lens)
    run = lambda: backend._run(s.q, layer, fb, q_lens, decode=True)  # noqa: E731
    run()  # the first step rotates every key

    def steady_step():
        # As at each real decode step, all keys but the newest are already rotated, and all values read.
        cache = backend.decode_kv._entries
        for key, (keys, values, used, seq_len) in cache.items():
            cache[key] = (keys, values, used - 1, seq_len - 1)
        return run()

    return steady_step


def native_fn(s, rope, decode):
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    backend = object.__new__(TorchNativeAttnBackend)
    q = s.q.view(-1, HQ, D)
    out = torch.empty_like(q)
    # torch_native's pool holds keys rotated at write time; slot i of each request is at position i.
    pos = torch.arange(s.k.shape[0]) % s.seq_lens[0]
    k_rot = rope.rotate(s.k, pos)
    common = dict(scaling=D ** -0.5, enable_gqa=True)
    if decode:
        return lambda: backend._run_sdpa_forward_decode(q, out, k_rot, s.v, s.req_to_token, s.rows, s.seq_lens,
                                                        causal=False, **common)
    return lambda: backend._run_sdpa_forward_extend(q, out, k_rot, s.v, s.req_to_token, s.rows, s.seq_lens,
                                                    s.prefix, s.ext, causal=True, **common)


def timed(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_cpu(repeat, contexts=(1024, 4096)):
    rope = Rope(cos_sin_cache(D, 8192), D, D, True)
    print("## CPU: mepic torch path vs SGLang torch_native (fp32, 9/3 heads, head dim 64)\n")
    print("| case | batch x new tokens | context | torch_native ms | mepic ms | ratio "
          "| mepic general path ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for name, batch, new, decode in (("prefill", 1, None, False), ("decode", 8, 1, True)):
        for ctx in contexts:
            s = setup(batch, ctx, new or ctx)
            native = timed(native_fn(s, rope, decode), repeat)
            mepic = timed(mepic_fn(s, rope, decode), repeat)
            general = timed(mepic_fn(s, rope, decode, general=True), repeat)
            # Same attention, computed three ways: a check that the timings compare like with like.
            ref = native_fn(s, rope, decode)().view(-1, HQ, D)
            for fn in (mepic_fn(s, rope, decode), mepic_fn(s, rope, decode, general=True)):
                torch.testing.assert_close(fn().view(-1, HQ, D), ref, atol=1e-4, rtol=1e-4)
            ratios.append(mepic / native)
            print(f"| {name} | {batch} x {new or ctx} | {ctx} | {native * 1e3:.1f} | {mepic * 1e3:.1f} "
                  f"| {mepic / native:.2f} | {general * 1e3:.1f} | {general / native:.2f} |")
    print(f"\nworst ratio, requests without chunks: {max(ratios):.2f} (goal <= 1.3)\n")


def bench_kernels():
    from sglang_mepic.attention.reference import attend
    from sglang_mepic.kernels import attention as kernels

    print("## Triton kernels under TRITON_INTERPRET=1: max |kernel - torch path|\n")
    print("| kernel | dtype | max abs error |")
    print("|---|---|---|")
    g = torch.Generator().manual_seed(0)
    rope = Rope(cos_sin_cache(D, 1024), D, D, True)
    n = 96
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        k = torch.randn(n, HKV, D, generator=g).to(dtype)
        v = torch.randn(n, HKV, D, generator=g).to(dtype)
        r2t = torch.randperm(n, generator=g).to(torch.int32)[None]
        pos = torch.arange(n, dtype=torch.int32) * 2
        pos[torch.rand(n, generator=g) < 0.1] = -1
        pos[-8:] = torch.arange(2 * n, 2 * n + 8, dtype=torch.int32)
        r2p = pos[None].clone()
        ref_for = lambda q, qp: attend(q.float(), qp.long(), k[r2t[0].long()].float(), v[r2t[0].long()].float(),  # noqa: E731
                                       r2p[0].long(), rope, D ** -0.5)
        qp = r2p[0, -1:].clone()
        q = rope.rotate(torch.randn(1, HQ, D, generator=g), qp.long()).to(dtype)
        out = kernels.decode(q, k, v, r2t, r2p, torch.tensor([0], dtype=torch.int32),
                             torch.tensor([n], dtype=torch.int32), qp, rope.cos_sin_cache, D, True, D ** -0.5)
        print(f"| decode | {dtype} | {(out.float() - ref_for(q, qp)).abs().max().item():.1e} |")
        qp = r2p[0, -8:].clone()
        q = rope.rotate(torch.randn(8, HQ, D, generator=g), qp.long()).to(dtype)
        out = kernels.extend(q, k, v, r2t, r2p, torch.tensor([0], dtype=torch.int32),
                             torch.tensor([n], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                             torch.tensor([8], dtype=torch.int32), qp, rope.cos_sin_cache, D, True, D ** -0.5, 8,
                             block_m=16, block_n=32)
        print(f"| extend | {dtype} | {(out.float() - ref_for(q, qp)).abs().max().item():.1e} |")


# ---- GPU: ours vs SGLang's Triton kernels vs FlashAttention -------------------------------------------

TOL = {torch.float32: 2e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def paged_pool(seq_lens, hkv, d, dtype, device, page_size=16, seed=0):
    """K/V pools with each request's pages in random order; slot j of a request at position j."""
    g = torch.Generator().manual_seed(seed)
    pages_per_row = math.ceil(max(seq_lens) / page_size)
    num_pages = len(seq_lens) * pages_per_row + 3
    order = torch.randperm(num_pages, generator=g)
    k = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype).to(device)
    v = torch.randn(num_pages * page_size, hkv, d, generator=g).to(dtype).to(device)
    rows = len(seq_lens) + 1
    r2t = torch.zeros(rows, max(seq_lens) + 8, dtype=torch.int32)
    r2p = torch.full_like(r2t, -1)
    for i, n in enumerate(seq_lens):
        pages = order[i * pages_per_row:(i + 1) * pages_per_row]
        r2t[i, :n] = (pages[:, None] * page_size + torch.arange(page_size)).flatten()[:n].to(torch.int32)
        r2p[i, :n] = torch.arange(n, dtype=torch.int32)
    req_idx = torch.arange(len(seq_lens), dtype=torch.int32)
    return k, v, r2t.to(device), r2p.to(device), req_idx.to(device)


class Peers:
    """The comparison, for one device and shape set."""

    def __init__(self, args):
        from torch.nn.attention import SDPBackend

        from sglang_mepic.kernels import attention as kernels

        self.args, self.dev, self.kernels, self.SDPBackend = args, args.device, kernels, SDPBackend
        self.dtype = getattr(torch, args.dtype or ("bfloat16" if self.dev == "cuda" else "float16"))
        self.hq, self.hkv, self.d = (4, 2, 64) if args.tiny else (32, 8, 128)
        self.max_pos = 65536
        cache = cos_sin_cache(self.d, self.max_pos)
        self.rope = Rope(cache.to(self.dev), self.d, self.d, True)
        freqs = Rope(cache, self.d, self.d, True).frequencies() if args.rope == "chip" else None
        self.rope_args = {} if freqs is None else dict(inv_freq=freqs[0].to(self.dev), mscale=freqs[1])
        self.sms = kernels.sm_count(self.dev)

    def timed(self, fn, rep):
        if self.dev != "cuda":
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
        from triton.testing import do_bench, do_bench_cudagraph

        return do_bench_cudagraph(fn, rep=rep) if self.args.graph else do_bench(fn, warmup=10, rep=rep)

    def reference(self, q, k, v, qpos):
        """fp32 attention of q [n, Hq, D] at positions qpos over k, v [L, Hkv, D] at positions 0..L-1."""
        from torch.nn.attention import sdpa_kernel

        mask = torch.arange(k.shape[0], device=q.device) <= qpos.view(-1, 1)
        with sdpa_kernel([self.SDPBackend.MATH]):
            out = torch.nn.functional.scaled_dot_product_attention(
                *(t.float().transpose(0, 1) for t in (q, k, v)), attn_mask=mask, scale=self.d ** -0.5,
                enable_gqa=True)
        return out.transpose(0, 1)

    def measure(self, row, name, fn, pick, ref, rep):
        try:
            out = pick(fn())
            err = (out.float() - ref).abs().max().item()
            ok = err <= TOL[self.dtype] * (1 + ref.abs().max().item())
            row["check"][name] = dict(max_err=round(err, 5), ok=ok)
            row["ms"][name] = round(self.timed(fn, rep), 4) if ok else float("nan")
        except Exception as e:  # report it, go on with the others
            row["check"][name] = dict(ok=False, error=f"{type(e).__name__}: {str(e)[-300:]}")
            row["ms"][name] = float("nan")

    def sdpa(self, q, k, v, backends, is_causal=False, mask=None):
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backends if self.dev == "cuda" else [self.SDPBackend.MATH]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                                                    enable_gqa=True)

    def decode(self, batch, ctx):
        from gpu.sglang_decode import SglangDecode  # eval/gpu: the harness without SGLang times it the same way

        hq, hkv, d, dev = self.hq, self.hkv, self.d, self.dev
        kp, vp, r2t, r2p, ri = paged_pool([ctx] * batch, hkv, d, self.dtype, dev, seed=1)
        seq = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        qpos = torch.full((batch,), ctx - 1, dtype=torch.int32, device=dev)
        q = torch.randn(batch, hq, d, device=dev, dtype=self.dtype)
        slots = r2t[ri.long(), :ctx].long()
        n = min(batch, 4)
        ref_pre = torch.cat([self.reference(q[i:i + 1], kp[slots[i]], vp[slots[i]], qpos[i:i + 1]) for i in range(n)])
        ref_rot = torch.cat([self.reference(q[i:i + 1], self.rope.rotate(kp[slots[i]].float()), vp[slots[i]],
                                            qpos[i:i + 1]) for i in range(n)])
        row = dict(kind="decode", batch=batch, ctx=ctx, ms={}, check={})
        ws = self.kernels.DecodeWorkspace(batch, hq, d, dev)
        cache = self.rope.cos_sin_cache
        # Splits for the capacity of the decode kernel compiled on this device, as the backend sizes them.
        ctas = self.kernels.decode_ctas_per_sm(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, d, True, d ** -0.5,
                                               **self.rope_args)
        splits = self.kernels.num_kv_splits(seq, self.kernels.decode_programs_per_split(batch, hq, hkv), self.sms,
                                            ctas_per_sm=ctas)
        row["our_splits"], row["our_ctas_per_sm"] = int(splits[0]), ctas
        self.measure(row, "ours", lambda: self.kernels.decode(q, kp, vp, r2t, r2p, ri, seq, qpos, cache, d, True,
                                                             d ** -0.5, splits=splits, workspace=ws,
                                                             **self.rope_args), lambda o: o[:n], ref_rot, 50)
        # As SGLang's triton backend launches it: its own split heuristic, PDL on sm90+.
        sglang = SglangDecode(q, kp, vp, slots, seq, self.sms, d ** -0.5)
        if sglang.note:
            row["sglang_splits_note"] = sglang.note
        row["sglang_splits"] = int(sglang.splits[0])
        self.measure(row, "sglang", sglang, lambda o: o[:n], ref_pre, 50)
        row["sglang_pdl"] = sglang.pdl
        kc, vc = (p[slots].transpose(1, 2).contiguous() for p in (kp, vp))
        flash = [self.SDPBackend.FLASH_ATTENTION]
        self.measure(row, "flash", lambda: self.sdpa(q.view(batch, hq, 1, d), kc, vc, flash),
                     lambda o: o[:n, :, 0], ref_pre, 50)
        return row

    def extend(self, ctx, new):
        from torch.nn.attention.bias import causal_lower_right

        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

        hq, hkv, d, dev = self.hq, self.hkv, self.d, self.dev
        prefix = ctx - new
        kp, vp, r2t, r2p, ri = paged_pool([ctx], hkv, d, self.dtype, dev, seed=2)
        slots = r2t[0, :ctx].long()
        seq = torch.tensor([ctx], dtype=torch.int32, device=dev)
        pos = torch.arange(prefix, ctx, dtype=torch.int32, device=dev)
        q = torch.randn(new, hq, d, device=dev, dtype=self.dtype)
        rows = torch.unique(torch.cat([torch.arange(min(new, 64)), torch.arange(max(0, new - 64), new)])).to(dev)
        ref_pre = self.reference(q[rows], kp[slots], vp[slots], prefix + rows)
        ref_rot = self.reference(q[rows], self.rope.rotate(kp[slots].float()), vp[slots], prefix + rows)
        row = dict(kind="extend", ctx=ctx, new=new, ms={}, check={})
        zero = torch.zeros(1, dtype=torch.int32, device=dev)
        lens = torch.tensor([new], dtype=torch.int32, device=dev)
        self.measure(row, "ours", lambda: self.kernels.extend(q, kp, vp, r2t, r2p, ri, seq, zero, lens, pos,
                                                             self.rope.cos_sin_cache, d, True, d ** -0.5, new,
                                                             **self.rope_args), lambda o: o[rows], ref_rot, 30)
        # SGLang's forward_extend: the prefix through kv_indices into the pool, the new tokens' K/V contiguous.
        ke, ve = kp[slots[prefix:]].contiguous(), vp[slots[prefix:]].contiguous()
        kv_indices = slots[:prefix] if prefix else torch.zeros(1, dtype=torch.int64, device=dev)
        kv_indptr = torch.tensor([0, prefix], dtype=torch.int32, device=dev)
        qo_indptr = torch.tensor([0, new], dtype=torch.int64, device=dev)
        o = torch.empty_like(q)

        def sglang():
            extend_attention_fwd(q, ke, ve, o, kp, vp, qo_indptr, kv_indptr, kv_indices, None, True, None, new, 1.0,
                                 1.0, d ** -0.5, extend_seq_lens_cpu=[new])
            return o
        self.measure(row, "sglang", sglang, lambda o: o[rows], ref_pre, 30)
        kc, vc = (p[slots].transpose(0, 1).unsqueeze(0).contiguous() for p in (kp, vp))
        mask = None if new == ctx else causal_lower_right(new, ctx)
        self.measure(row, "flash", lambda: self.sdpa(q.transpose(0, 1).unsqueeze(0), kc, vc,
                                                     [self.SDPBackend.FLASH_ATTENTION,
                                                      self.SDPBackend.EFFICIENT_ATTENTION],
                                                     is_causal=new == ctx, mask=mask),
                     lambda o: o[0].transpose(0, 1)[rows], ref_pre, 30)
        return row


def bench_peers(args):
    peers = Peers(args)
    if args.tiny:
        decode_grid, extend_grid = [(2, 64), (1, 200)], [(64, 64), (96, 32)]
    elif args.quick:
        decode_grid = [(1, 4096), (8, 4096), (32, 4096), (1, 32768), (8, 32768), (64, 8192)]
        extend_grid = [(4096, 4096), (8192, 512), (16384, 1024)]
    else:  # ../shared/gpu-bench's grid
        decode_grid = [(1, 1024), (1, 4096), (1, 32768), (8, 1024), (8, 4096), (8, 32768), (32, 4096), (32, 16384),
                       (128, 2048), (128, 8192)]
        extend_grid = [(1024, 1024), (4096, 4096), (16384, 16384), (8192, 512), (16384, 1024), (32768, 2048)]
    device = torch.cuda.get_device_name() if peers.dev == "cuda" else "cpu (TRITON_INTERPRET=1, timings meaningless)"
    info = dict(device=device, torch=torch.__version__, dtype=str(peers.dtype), heads=[peers.hq, peers.hkv, peers.d],
                rope=args.rope, timer="do_bench_cudagraph" if args.graph else "do_bench")
    print(json.dumps(info), flush=True)
    rows = []
    for batch, ctx in decode_grid:
        rows.append(peers.decode(batch, ctx))
        print(json.dumps(rows[-1]), flush=True)
        if peers.dev == "cuda":
            torch.cuda.empty_cache()
    for ctx, new in extend_grid:
        rows.append(peers.extend(ctx, new))
        print(json.dumps(rows[-1]), flush=True)
        if peers.dev == "cuda":
            torch.cuda.empty_cache()
    print(f"\n## {device}: ms, and ours / peer ({peers.dtype}, heads {peers.hq}/{peers.hkv}/{peers.d}, "
          f"our RoPE from {args.rope})\n")
    print("| case | ours | SGLang triton | flash | ours / SGLang | ours / flash | checks |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        case = (f"decode, batch {r['batch']}, context {r['ctx']}" if r["kind"] == "decode"
                else f"{r['new']} new tokens on {r['ctx']} context" if r["new"] != r["ctx"]
                else f"prefill {r['ctx']} (fresh)")
        ms = r["ms"]
        checks = "ok" if all(c["ok"] for c in r["check"].values()) else \
            "FAILED: " + ", ".join(k for k, c in r["check"].items() if not c["ok"])
        print(f"| {case} | {ms['ours']:.3f} | {ms['sglang']:.3f} | {ms['flash']:.3f} | "
              f"{ms['ours'] / ms['sglang']:.2f} | {ms['ours'] / ms['flash']:.2f} | {checks} |")
    path = os.path.join(os.environ.get("OUT", "."), "bench_attention_gpu.json")
    with open(path, "w") as f:
        json.dump(dict(info=info, rows=rows), f, indent=1)
    print("\nwrote", path)
    return 0 if all(c["ok"] for r in rows for c in r["check"].values()) else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--contexts", default="1024,4096", help="on cpu: the context lengths timed (comma-separated)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--peers", action="store_true", help="on cpu: the GPU comparison, under the interpreter")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes (4 q heads, 2 kv heads, head dim 64)")
    parser.add_argument("--quick", action="store_true", help="a smaller GPU grid")
    parser.add_argument("--graph", action="store_true", help="time CUDA-graph replays (no launch overhead)")
    parser.add_argument("--rope", choices=("chip", "table"), default="chip", help="where our kernels get cos/sin")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                        help="GPU default bfloat16; float16 under the interpreter, whose bf16 dots are wrong")
    args = parser.parse_args()
    if args.device == "cuda" or args.peers:
        return bench_peers(args)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads\n")
    bench_cpu(args.repeat, [int(c) for c in args.contexts.split(",")])
    bench_kernels()
    return 0


if __name__ == "__main__":
    sys.exit(main())
