"""The attention side's per-batch calls on a GPU under `torch.cuda.set_sync_debug_mode("error")` (issue 69).

The device counterpart of tests/attention/test_host_syncs.py (which runs them on the meta device): the mepic backend
over CUDA pools, on its Triton path, prepares the batches a served mepic server sees and runs their
attention, each call alone with the sync debug mode at "error", so a device-to-host synchronisation raises
at the operation that makes it:
- the position map's writers: a plan handed over on the device (as cache/extend.py does) and on the host,
  a release;
- init_forward_metadata for an extend of planned and plain rows, a mixed batch (a decode token riding in
  an extend), a decode;
- the decode CUDA-graph hooks (capture, a replay with padding rows), the breakable prefill graph hooks
  (capture of a bucket, a replay with a planned row, the runner's check);
- the extend and decode kernels' launches as the backend makes them (compiled first, outside the check).
The served side is watched by MEPIC_SYNC_DEBUG=warn on the e2e run's mepic server (drive.py judges its log).

    PYTHONPATH=$SITE:$PWD python3 -m eval.gpu.e2e.sync_check --out $OUT/sync_check.json

Prints one line per call and exits 1 if any synchronised. Needs CUDA and SGLang (the carry's site).
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

# An 8B layer's heads; a prompt of 1224 tokens (the workload's median is near it). --cpu: tiny, interpreted.
GPU = SimpleNamespace(device="cuda", dtype=torch.bfloat16, rows=16, width=4096, hq=32, hkv=8, d=128, slots=65536,
                      prompt=1224, other=700, gap=24, bucket=2048)
CPU = SimpleNamespace(device="cpu", dtype=torch.float32, rows=8, width=160, hq=4, hkv=2, d=64, slots=2048,
                      prompt=60, other=30, gap=4, bucket=64)


def mode(name):
    return SimpleNamespace(name=name, is_decode=lambda: name == "DECODE", is_extend=lambda: name in ("EXTEND", "MIXED"))


def extend_batch(rows, prefix, ext, name="EXTEND", device="cuda"):
    seq = [p + e for p, e in zip(prefix, ext)]
    positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix, seq)])
    return SimpleNamespace(
        forward_mode=mode(name), batch_size=len(rows), req_pool_indices=torch.tensor(rows, device=device),
        req_pool_indices_cpu=torch.tensor(rows), seq_lens=torch.tensor(seq, device=device),
        seq_lens_cpu=torch.tensor(seq), extend_prefix_lens=torch.tensor(prefix, device=device),
        extend_prefix_lens_cpu=list(prefix), extend_seq_lens=torch.tensor(ext, device=device),
        extend_seq_lens_cpu=list(ext), positions=positions.to(device),
        out_cache_loc=torch.arange(sum(ext), device=device))


def decode_batch(rows, seq, device="cuda"):
    return SimpleNamespace(forward_mode=mode("DECODE"), batch_size=len(rows),
                           req_pool_indices=torch.tensor(rows, device=device), seq_lens=torch.tensor(seq, device=device),
                           seq_lens_cpu=torch.tensor(seq), positions=torch.tensor([s - 1 for s in seq], device=device))


def build(c):
    """The backend over pools of shuffled slots, on its Triton path."""
    from sglang_mepic.attention.backend import MepicAttnBackend
    from sglang_mepic.attention.rope import Rope, cos_sin_cache
    from sglang_mepic.kernels import attention as kernels

    rope = Rope(cos_sin_cache(c.d, 8192).to(c.device), c.d, c.d, True)
    k_pool = torch.randn(c.slots, c.hkv, c.d, device=c.device).to(c.dtype)
    v_pool = torch.randn(c.slots, c.hkv, c.d, device=c.device).to(c.dtype)
    r2t = torch.randperm(c.slots, device=c.device)[: c.rows * c.width].view(c.rows, c.width).to(torch.int32)
    backend = MepicAttnBackend.over_pools(r2t, k_pool, v_pool, rope, q_heads=c.hq)
    if not backend.use_triton:  # --cpu: the interpreter
        backend._use_kernels(kernels)
    return backend


def calls(backend, c):
    """(name, setup, call) in the order a server makes them: `setup()` builds the call's inputs (host-to-device
    copies included) outside the check, `call(inputs)` is what is checked."""
    layer = SimpleNamespace(tp_q_head_num=c.hq, qk_head_dim=c.d, v_head_dim=c.d, layer_id=0, scaling=c.d ** -0.5,
                            is_cross_attention=False, sliding_window_size=-1)
    half = (c.prompt - c.gap) // 2  # a plan: a chunk, a pad run, a chunk placed further on
    plan = torch.cat([torch.arange(0, half), torch.full((c.gap,), -1),
                      torch.arange(2 * half, 3 * half)]).to(torch.int32)
    p, o, dev = c.prompt, c.other, c.device
    eb = lambda *a, **k: extend_batch(*a, device=dev, **k)  # noqa: E731
    q = lambda n: torch.randn(n, c.hq * c.d, device=dev).to(c.dtype)  # noqa: E731

    def extend_setup():
        fb = eb([1, 3, 5], [0, 0, p], [p, o, 1])
        return fb, q(fb.positions.shape[0])

    def extend_forward(inputs):
        fb, q = inputs
        backend.init_forward_metadata(fb)
        backend.forward_extend(q, None, None, layer, fb, save_kv_cache=False)

    def decode_setup():
        return decode_batch([1, 3, 5], [p + 2, o + 1, p + 2], device=dev), q(3)

    def decode_forward(inputs):
        fb, q = inputs
        backend.init_forward_metadata(fb)
        backend.forward_decode(q, None, None, layer, fb, save_kv_cache=False)

    def decode_graph_setup():
        backend.init_cuda_graph_state(8, 8)
        buffers = dict(req_pool_indices=torch.tensor([1, 3, 0, 0, 0, 0, 0, 0], device=dev),
                       seq_lens=torch.tensor([p + 2, o + 1] + [1] * 6, device=dev),
                       positions=torch.tensor([p + 1, o] + [0] * 6, device=dev))
        return (SimpleNamespace(batch_size=8, forward_mode=mode("DECODE"), **buffers),
                SimpleNamespace(batch_size=8, num_padding=6, forward_mode=mode("DECODE"), **buffers))

    def decode_graph(inputs):
        capture, view = inputs
        backend.init_forward_metadata_out_graph(capture, in_capture=True)
        backend.init_forward_metadata_out_graph(view)
        backend.init_forward_metadata_in_graph(view)

    def prefill_graph_setup():
        static_positions = torch.arange(2 * c.bucket, device=dev)
        capture = eb([0, 1], [0, 0], [c.bucket, c.bucket])
        capture.positions = static_positions
        live = eb([1, 3], [p - c.gap, 0], [c.gap, o])
        static_positions[:c.gap + o].copy_(live.positions)  # the runner's fill of its static buffer
        return capture, live, SimpleNamespace(positions=static_positions)

    def prefill_graph(inputs):
        capture, live, static = inputs
        meta = backend.init_forward_metadata_for_breakable_cuda_graph_capture(capture)
        assert backend.can_run_prefill_cuda_graph(live)
        backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(meta, live, static_forward_batch=static)

    return [
        ("positions.assign (a plan on the device)", lambda: plan.to(dev), lambda x: backend.positions.assign(1, x)),
        ("positions.assign (a plan on the host)", lambda: plan, lambda x: backend.positions.assign(5, x)),
        ("positions.release", lambda: 7, backend.positions.release),
        ("extend: init_forward_metadata + kernels", extend_setup, extend_forward),
        ("mixed: init_forward_metadata", lambda: eb([1, 5, 3], [0, p, o], [half, 1, 1], name="MIXED"),
         backend.init_forward_metadata),
        ("decode: init_forward_metadata + kernels", decode_setup, decode_forward),
        ("decode graph hooks (capture, replay)", decode_graph_setup, decode_graph),
        ("prefill graph hooks (capture, check, replay)", prefill_graph_setup, prefill_graph),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="write the verdicts as JSON here")
    ap.add_argument("--cpu", action="store_true",
                    help="the dry run: tiny shapes under the Triton interpreter (TRITON_INTERPRET=1), no sync check")
    args = ap.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        print("sync check: no CUDA device, nothing checked (--cpu: the dry run)")
        return 2
    c = CPU if args.cpu else GPU
    started = time.perf_counter()
    torch.manual_seed(69)
    backend = build(c)
    todo = calls(backend, c)
    for name, setup, call in todo:  # once unwatched: Triton compiles, caches fill
        call(setup())
    sync = torch.cuda.synchronize if not args.cpu else (lambda: None)
    sync()
    rows = []
    for name, setup, call in todo:
        inputs = setup()
        sync()
        if not args.cpu:
            torch.cuda.set_sync_debug_mode("error")
        try:
            call(inputs)
            row = {"call": name, "ok": True}
        except RuntimeError as e:
            row = {"call": name, "ok": False, "error": str(e).splitlines()[0],
                   "where": traceback.format_exc().strip().splitlines()[-6:]}
        finally:
            if not args.cpu:
                torch.cuda.set_sync_debug_mode(0)
        sync()
        rows.append(row)
        print(f"sync check: {'ok  ' if row['ok'] else 'SYNC'} {name}" + ("" if row["ok"] else f": {row['error']}"),
              flush=True)
    bad = [r["call"] for r in rows if not r["ok"]]
    verdict = {"ok": not bad, "synchronised": bad, "calls": rows, "seconds": round(time.perf_counter() - started, 1),
               "device": "cpu (dry run, not checked)" if args.cpu else torch.cuda.get_device_name()}
    print(f"sync check: {len(rows) - len(bad)}/{len(rows)} calls without a host sync"
          + (f"; synchronised: {bad}" if bad else ""), flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(verdict, indent=1))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
