"""RAG evaluation: MEPIC against EPIC, CacheBlend, naive reuse and SGLang's prefix cache.

    .venv/bin/python -m eval.run --quick            # every system, 2 QPS x 2 context lengths, < 15 min
    .venv/bin/python -m eval.run                    # the full sweep (more QPS values and lengths)
    .venv/bin/python -m eval.run --dataset hotpotqa --qps 0.5,1 --chunks 4,8 --requests 24
    .venv/bin/python -m eval.run --reuse 0.85 --chunks 6 --requests 300   # a set share of chunks repeating

Each system gets a fresh server (SmolLM2-135M-Instruct, float32, greedy); between
sweep points its cache is flushed. Requests arrive open-loop (Poisson at the
given QPS) and stream, so TTFT is measured at the first token. KV memory is
sampled from the server's Prometheus `/metrics` (SGLang's used-token gauge,
which for the mepic cache counts what eviction cannot free) ten times a second,
and for the mepic cache its exact peak is read from `/server_info` too.

Output (under --out, default eval/results/<dataset>-quick or -full): table.md,
results.json (every figure, the command and the model) and PNG plots: peak KV
pages vs QPS, peak KV pages vs chunks per request, TTFT p50 vs QPS.
"""

import argparse
import json
import math
import random
import re
import shlex
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
from tqdm import tqdm

from eval.scoring import exact_match, f1, prefix_agreement, top1_agreement
from eval.workloads import DATASETS, render, reuse_ratio, with_reuse
from sglang_mepic import models
from sglang_mepic.server_process import ServerProcess

SYSTEMS = {
    "vanilla": ["--attention-backend", "torch_native", "--radix-cache-backend", "sglang"],
    "full": ["--mepic-mode", "full"],
    "naive": ["--mepic-mode", "naive"],
    "epic-16": ["--mepic-mode", "epic-16"],
    "cacheblend-0.15": ["--mepic-mode", "cacheblend-0.15"],
    "mepic": ["--mepic-mode", "mepic"],
}
REFERENCE = "full"  # fidelity is measured against it
QUICK = {"qps": [0.5, 2.0], "chunks": [2, 6], "requests": 8}
FULL = {"qps": [0.25, 0.5, 1.0, 2.0, 4.0], "chunks": [2, 4, 8, 16], "requests": 24}
USED_TOKENS = re.compile(r"^sglang:num_used_tokens\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass
class Point:
    """One system at one (QPS, chunks) point."""
    system: str
    qps: float
    chunks: int
    outputs: list = field(default_factory=list)  # (output_ids, text, meta_info, ttft, e2e) per request
    used_pages: list = field(default_factory=list)  # sampled KV pages in use
    exact_peak: int | None = None
    seconds: float = 0.0


class Sampler(threading.Thread):
    """Polls the used-token gauge while a point runs."""

    def __init__(self, url: str, page_size: int, period: float = 0.1):
        super().__init__(daemon=True)
        self.url, self.page_size, self.period = url, page_size, period
        self.pages: list[float] = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                m = USED_TOKENS.search(requests.get(self.url + "/metrics", timeout=5).text)
                if m:
                    self.pages.append(float(m.group(1)) / self.page_size)
            except requests.RequestException:
                pass
            self.stop.wait(self.period)


def stream(url: str, text: str, new_tokens: int):
    """Send one streaming request; returns (output_ids, text, meta_info, ttft, e2e)."""
    t0 = time.perf_counter()
    ttft, last = None, None
    with requests.post(url + "/generate", stream=True, timeout=900, json={
            "text": text, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            if ttft is None:
                ttft = time.perf_counter() - t0
            last = json.loads(data)
    return last["output_ids"], last["text"], last["meta_info"], ttft, time.perf_counter() - t0


def run_point(server, page_size: int, texts: list[str], qps: float, new_tokens: int, seed: int,
              bar: tqdm) -> tuple[list, list, int | None, float]:
    requests.post(server.url + "/flush_cache", timeout=60).raise_for_status()
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in texts:
        arrivals.append(t)
        t += rng.expovariate(qps)
    sampler = Sampler(server.url, page_size)
    sampler.start()
    start = time.perf_counter()

    def send(i):
        time.sleep(max(0.0, start + arrivals[i] - time.perf_counter()))
        out = stream(server.url, texts[i], new_tokens)
        bar.update()
        return out

    with ThreadPoolExecutor(len(texts)) as pool:
        outputs = list(pool.map(send, range(len(texts))))
    seconds = time.perf_counter() - start
    time.sleep(2 * sampler.period)
    sampler.stop.set()
    sampler.join()
    info = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]
    exact = info.get("mepic", {}).get("kv_pages_in_use_peak")
    return outputs, sampler.pages, exact, seconds


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else float("nan")


def kv_bytes_per_token(model_path: str) -> int:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * 4  # K and V, float32


def summarize(points: list[Point], requests_by_chunks: dict, new_tokens: int, page_bytes: int) -> list[dict]:
    ref = {(p.qps, p.chunks): p for p in points if p.system == REFERENCE}
    rows = []
    for p in points:
        ids = [o[0] for o in p.outputs]
        metas = [o[2] for o in p.outputs]
        golds = [r.answers for r in requests_by_chunks[p.chunks]]
        base = ref.get((p.qps, p.chunks))
        ref_ids = [o[0] for o in base.outputs] if base else ids
        peak = max(p.used_pages, default=0)
        if p.exact_peak is not None:
            peak = max(peak, p.exact_peak)
        recomputed = [m.get("mepic_recomputed_tokens", m["prompt_tokens"] - m["cached_tokens"]) for m in metas]
        ttft = [o[3] for o in p.outputs]
        e2e = [o[4] for o in p.outputs]
        rows.append({
            "system": p.system, "qps": p.qps, "chunks": p.chunks, "requests": len(ids),
            "peak_kv_pages": round(peak, 1),
            "mean_kv_pages": round(statistics.fmean(p.used_pages), 1) if p.used_pages else 0.0,
            "peak_kv_mib": round(peak * page_bytes / 2 ** 20, 2),
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99),
            "throughput_rps": len(ids) / p.seconds if p.seconds else 0.0,
            "output_tok_s": sum(len(i) for i in ids) / p.seconds if p.seconds else 0.0,
            "prompt_tokens": statistics.fmean(m["prompt_tokens"] for m in metas),
            "recomputed_tokens": statistics.fmean(recomputed),
            "f1": statistics.fmean(f1(o[1], g) for o, g in zip(p.outputs, golds)),
            "em": statistics.fmean(exact_match(o[1], g) for o, g in zip(p.outputs, golds)),
            "agreement": statistics.fmean(prefix_agreement(a, b, new_tokens) for a, b in zip(ids, ref_ids)),
            "top1": statistics.fmean(top1_agreement(a, b) for a, b in zip(ids, ref_ids)),
        })
    return rows


COLUMNS = [("system", "system", "{}"), ("qps", "QPS", "{:g}"), ("chunks", "chunks", "{}"),
           ("peak_kv_pages", "peak KV pages", "{:.0f}"), ("mean_kv_pages", "mean KV pages", "{:.0f}"),
           ("peak_kv_mib", "peak KV MiB", "{:.1f}"), ("ttft_p50", "TTFT p50 s", "{:.2f}"),
           ("ttft_p99", "TTFT p99 s", "{:.2f}"), ("e2e_p50", "e2e p50 s", "{:.2f}"), ("e2e_p99", "e2e p99 s", "{:.2f}"),
           ("throughput_rps", "req/s", "{:.2f}"), ("recomputed_tokens", "recomputed tok/req", "{:.0f}"),
           ("prompt_tokens", "prompt tok/req", "{:.0f}"), ("f1", "F1", "{:.3f}"), ("em", "EM", "{:.3f}"),
           ("agreement", "agreement vs full", "{:.3f}"), ("top1", "top-1 vs full", "{:.3f}")]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["chunks"], r["qps"], list(SYSTEMS).index(r["system"]))):
        lines.append("| " + " | ".join(fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def plots(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    chunks = sorted({r["chunks"] for r in rows})
    qps = sorted({r["qps"] for r in rows})
    for name, x, fixed, y, label in [("peak_kv_vs_qps.png", "qps", ("chunks", chunks[-1]), "peak_kv_pages",
                                      "peak KV pages"),
                                     ("peak_kv_vs_chunks.png", "chunks", ("qps", qps[0]), "peak_kv_pages",
                                      "peak KV pages"),
                                     ("ttft_vs_qps.png", "qps", ("chunks", chunks[-1]), "ttft_p50", "TTFT p50 (s)")]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for s in systems:
            pts = sorted((r[x], r[y]) for r in rows if r["system"] == s and r[fixed[0]] == fixed[1])
            if pts:
                ax.plot(*zip(*pts), marker="o", label=s)
        ax.set_xlabel("QPS" if x == "qps" else "chunks per request")
        ax.set_ylabel(label)
        ax.set_title(f"{label} ({fixed[0]} = {fixed[1]:g})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(out / name)
    return made


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['requests']} requests at QPS {QUICK['qps']} "
                                                          f"and {QUICK['chunks']} chunks per request")
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="squad")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--qps", default=None, help="comma-separated arrival rates (requests/s)")
    ap.add_argument("--chunks", default=None, help="comma-separated chunks per request (2-16)")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reuse", type=float, default=None,
                    help="share of chunks that repeat an earlier one, 0-0.95 (eval.workloads.with_reuse); "
                         "default: the dataset's own draw")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)

    preset = QUICK if args.quick else FULL
    qps = [float(x) for x in args.qps.split(",")] if args.qps else preset["qps"]
    chunk_counts = [int(x) for x in args.chunks.split(",")] if args.chunks else preset["chunks"]
    n = args.requests or preset["requests"]
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not all(2 <= c <= 16 for c in chunk_counts) or not all(q > 0 for q in qps):
        sys.exit(f"bad arguments: systems {unknown or 'ok'}, chunks {chunk_counts} (2-16), qps {qps} (> 0)")
    out = args.out or Path("eval/results") / f"{args.dataset}-{'quick' if args.quick else 'full'}"
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoTokenizer

    model = args.model or str(models.build(models.DEFAULT_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(model)
    try:
        workload = {c: (with_reuse(args.dataset, n, c, args.reuse, seed=args.seed) if args.reuse is not None
                        else DATASETS[args.dataset](n, c, seed=args.seed)) for c in chunk_counts}
    except ValueError as e:
        sys.exit(f"bad arguments: {e}")
    texts = {c: [render(tokenizer, r) for r in reqs] for c, reqs in workload.items()}
    ratios = {}
    for c, reqs in workload.items():
        ratios[c] = reuse_ratio(reqs, lambda d: tokenizer.encode(d, add_special_tokens=False))
        length = statistics.fmean(len(tokenizer.encode(t, add_special_tokens=False)) for t in texts[c])
        print(f"[workload] {args.dataset}: {n} requests x {c} chunks, reuse ratio {ratios[c]:.3f} "
              f"(chunk tokens that repeat an earlier chunk), mean prompt {length:.0f} tokens")

    page_size = 16
    page_bytes = kv_bytes_per_token(model) * page_size
    points: list[Point] = []
    total = len(systems) * len(qps) * len(chunk_counts) * n
    with tqdm(total=total, desc="requests", unit="req") as bar:
        for system in systems:
            bar.set_postfix_str(f"{system}: starting server")
            # A short decode log interval keeps SGLang's used-token gauge fresh for the sampler.
            with ServerProcess(model, "--dtype", "float32", "--decode-log-interval", "4", *SYSTEMS[system],
                               startup_timeout=600) as server:
                for c in chunk_counts:
                    for q in qps:
                        bar.set_postfix_str(f"{system} qps={q:g} chunks={c}")
                        outputs, pages, exact, seconds = run_point(server, page_size, texts[c], q,
                                                                   args.new_tokens, args.seed, bar)
                        points.append(Point(system, q, c, outputs, pages, exact, seconds))

    rows = summarize(points, workload, args.new_tokens, page_bytes)
    for row in rows:
        row["reuse_ratio"] = round(ratios[row["chunks"]], 4)
    md = table(rows)
    command = "python -m eval.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    header = (f"{args.dataset}, {n} requests per point, {args.new_tokens} new tokens, greedy, float32, "
              f"model {Path(model).name}; fidelity against `{REFERENCE}`. Realised reuse ratio (chunk tokens "
              f"that repeat an earlier chunk): " + ", ".join(f"{ratios[c]:.3f} at {c} chunks" for c in chunk_counts)
              + f".\n\nCommand: `{command}`\n\n")
    (out / "table.md").write_text(header + md + "\n")
    (out / "results.json").write_text(json.dumps({"command": command, "model": Path(model).name,
                                                  "dataset": args.dataset, "rows": rows}, indent=2))
    print(md)
    if not args.no_plots:
        for p in plots(rows, out):
            print(f"[plot] {p}")
    print(f"[results] {out}/table.md, {out}/results.json")


if __name__ == "__main__":
    main()
