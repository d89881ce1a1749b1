"""What the launch sweeps (sweep_decode.py, sweep_extend.py) share: their arguments, the interpreter
switch (set before torch and triton are imported), the timer, on-chip cos/sin and the run's record."""

import argparse
import json
import os
import time

START = time.perf_counter()


def parse(name: str, budget: float) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=f"{name}: see its docstring")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (for the interpreter)")
    ap.add_argument("--budget", type=float, default=budget, help="seconds; variants stop being timed after it")
    ap.add_argument("--json", help=f"default $OUT/{name}.json")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return args


def spent(args) -> bool:
    return time.perf_counter() - START > args.budget


def timed(fn, dev: str) -> float:
    """ms: do_bench's median on a GPU (L2 flushed); under the interpreter one call, only to show it runs."""
    if dev != "cuda":
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    from triton.testing import do_bench
    return do_bench(fn, warmup=10, rep=60, return_mode="median")


def rope(d: int, dev: str, max_pos: int):
    """(cos/sin table on dev, the kwargs that make the kernels compute cos/sin on chip)."""
    from sglang_mepic.attention.rope import Rope, cos_sin_cache

    table = cos_sin_cache(d, max_pos)
    freqs = Rope(table, d, d, True).frequencies()
    return table.to(dev), dict(inv_freq=freqs[0].float().contiguous().to(dev), mscale=freqs[1])


def info(dev: str, dtype, heads, sms: int) -> dict:
    import torch
    import triton

    record = dict(device=torch.cuda.get_device_name() if dev == "cuda" else "cpu", torch=torch.__version__,
                  triton=triton.__version__, sms=sms, project_commit=open("proj/COMMIT").read().strip()
                  if os.path.exists("proj/COMMIT") else "?", dtype=str(dtype), heads=list(heads))
    print(json.dumps(record), flush=True)
    return record


def write(args, name: str, record: dict, rows: list) -> None:
    path = args.json or os.path.join(os.environ.get("OUT", "."), f"{name}.json")
    json.dump(dict(info=record, rows=rows), open(path, "w"), indent=1)
    print("wrote", path)


def measure(run, ref: list, dev: str) -> tuple[float, float]:
    """(ms, largest difference from the first variant's output); `ref` keeps that output once taken."""
    out = run().float()
    if not ref:
        ref.append(out.clone())
    return timed(run, dev), (out - ref[0]).abs().max().item()


def failed(e: Exception, **where) -> None:
    print(json.dumps(dict(**where, error=f"{type(e).__name__}: {str(e)[-200:]}")), flush=True)
