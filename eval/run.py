"""RAG evaluation: MEPIC against EPIC, CacheBlend, naive reuse and SGLang's prefix cache.

    .venv/bin/python -m eval.run --quick            # every system, 2 QPS x 2 context lengths, < 15 min
    .venv/bin/python -m eval.run                    # the full sweep (more QPS values and lengths)
    .venv/bin/python -m eval.run --dataset hotpotqa --qps 0.5,1 --chunks 4,8 --requests 24
    .venv/bin/python -m eval.run --reuse 0.85 --chunks 6 --requests 300   # a set share of chunks repeating
    .venv/bin/python -m eval.run --paper [--dataset hotpotqa] [--sweeps qps,chunks,reuse]

`--paper` runs the MEPIC paper's sweeps at its scale: 300 requests per point, the
SQuAD shape of its Table 1 (about 85% of chunk tokens reused, about 2.2k prompt
tokens: 7 chunks) as the base point, and one variable swept at a time: QPS (light
load to past this machine's saturation), chunks per request (2-16) and reuse
(0.3-0.95). It serves the tiny random Llama: pages, reuse and scheduling do not
depend on model quality, and it is fast enough on 2 cores for 300-request points.
Fidelity is measured apart, on SmolLM2 (eval.fidelity).

Each system gets a fresh server (SmolLM2-135M-Instruct, float32, greedy); between
sweep points its cache is flushed. Requests arrive open-loop (Poisson at the
given QPS) and stream, so TTFT is measured at the first token. KV memory is
sampled from the server's Prometheus `/metrics` (SGLang's used-token gauge,
which for the mepic cache counts what eviction cannot free) ten times a second,
and for the mepic cache its exact peak is read from `/server_info` too. From
the server log: how long the scheduler held each chunked request back for its
chunks' compiles (`compile wait`, p50; a request whose chunks are all resident
is never held) and the share of requests it held (`held for compiles`).

Output (under --out, default eval/results/<dataset>-quick, -full or -paper): table.md,
results.json (every figure, the command and the model) and PNG plots: peak KV
pages and TTFT p50 (with --paper also p99) against each swept variable. Each
finished (system, point) is saved to points.jsonl there as it ends; if a run
stops, the same command with --resume runs only what is missing.
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
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import requests
from tqdm import tqdm

from eval.checkpoint import Checkpoint
from eval.scoring import exact_match, f1, prefix_agreement, top1_agreement
from eval.workloads import DATASETS, render, reuse_ratio, with_reuse
from sglang_mepic import models
from sglang_mepic.launch_server import CPU_MAX_TOTAL_TOKENS, MEPIC_PAGE_SIZE
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
# The paper's sweeps around its SQuAD row (Table 1: 84.9% reused, 2,224 prompt tokens).
PAPER = {"base": {"qps": 2.0, "chunks": 7, "reuse": 0.85}, "requests": 300,
         "qps": [1.0, 2.0, 4.0, 8.0, 16.0], "chunks": [2, 4, 8, 16], "reuse": [0.3, 0.5, 0.7, 0.85, 0.95]}
SWEEPS = ("qps", "chunks", "reuse")
DEFAULT_POOL_PAGES = CPU_MAX_TOTAL_TOKENS // MEPIC_PAGE_SIZE
USED_TOKENS = re.compile(r"^sglang:num_used_tokens\{[^}]*\} ([0-9.e+]+)$", re.M)
# The scheduler's line per chunked request it admits (radix_cache.MepicRadixCache.admit).
COMPILES = re.compile(r"MEPIC request \S+: \d+ chunk\(s\) found ([^;]+); waited ([0-9.]+) s for compiles")


@dataclass
class Point:
    """One system at one (QPS, chunks, reuse) point."""
    system: str
    qps: float
    chunks: int
    reuse: float | None = None  # the requested share of repeating chunks (None: the dataset's own draw)
    outputs: list = field(default_factory=list)  # (output_ids, text, meta_info, ttft, e2e) per request
    used_pages: list = field(default_factory=list)  # sampled KV pages in use
    exact_peak: int | None = None
    seconds: float = 0.0
    compile_waits: list = field(default_factory=list)  # (every chunk already on the device, seconds) per request
    pool_pages: int = 0  # the KV pool the server reported
    wall: float = 0.0  # seconds since the point before it ended, server start included

    @classmethod
    def load(cls, record: dict) -> "Point":
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


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


def pool_pages(server, page_size: int) -> int:
    """The KV pool the server allocated (SGLang's `max_total_num_tokens`), in pages."""
    return requests.get(server.url + "/server_info", timeout=60).json()["max_total_num_tokens"] // page_size


def compile_waits(log: str) -> list[tuple[bool, float]]:
    """How long each chunked request was held back for its chunk compiles, and whether all were resident."""
    return [(all(part.split()[1] == "device" for part in found.split(", ")), float(sec))
            for found, sec in COMPILES.findall(log)]


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else float("nan")


def kv_bytes_per_token(model_path: str) -> int:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * 4  # K and V, float32


def summarize(points: list[Point], workloads: dict, new_tokens: int, page_bytes: int) -> list[dict]:
    """One row per point; `workloads` maps (chunks, reuse) to the requests sent."""
    ref = {(p.qps, p.chunks, p.reuse): p for p in points if p.system == REFERENCE}
    rows = []
    for p in points:
        ids = [o[0] for o in p.outputs]
        metas = [o[2] for o in p.outputs]
        golds = [r.answers for r in workloads[(p.chunks, p.reuse)]]
        base = ref.get((p.qps, p.chunks, p.reuse))
        ref_ids = [o[0] for o in base.outputs] if base else None  # no reference ran: no fidelity figures
        peak = max(p.used_pages, default=0)
        if p.exact_peak is not None:
            peak = max(peak, p.exact_peak)
        recomputed = [m.get("mepic_recomputed_tokens", m["prompt_tokens"] - m["cached_tokens"]) for m in metas]
        ttft = [o[3] for o in p.outputs]
        e2e = [o[4] for o in p.outputs]
        rows.append({
            "system": p.system, "qps": p.qps, "chunks": p.chunks, "reuse": p.reuse, "requests": len(ids),
            "pool_pages": p.pool_pages,
            "peak_kv_pages": round(peak, 1),
            "mean_kv_pages": round(statistics.fmean(p.used_pages), 1) if p.used_pages else 0.0,
            "peak_kv_mib": round(peak * page_bytes / 2 ** 20, 2),
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99),
            # None where the server logged no compiles (a system that compiles nothing)
            "compile_wait_p50": pct([w for _, w in p.compile_waits], 0.5) if p.compile_waits else None,
            "compile_wait_resident_p50": pct([w for resident, w in p.compile_waits if resident], 0.5)
            if any(resident for resident, _ in p.compile_waits) else None,
            "compile_held": statistics.fmean(w > 0 for _, w in p.compile_waits) if p.compile_waits else None,
            "throughput_rps": len(ids) / p.seconds if p.seconds else 0.0,
            "output_tok_s": sum(len(i) for i in ids) / p.seconds if p.seconds else 0.0,
            "prompt_tokens": statistics.fmean(m["prompt_tokens"] for m in metas),
            "recomputed_tokens": statistics.fmean(recomputed),
            "f1": statistics.fmean(f1(o[1], g) for o, g in zip(p.outputs, golds)),
            "em": statistics.fmean(exact_match(o[1], g) for o, g in zip(p.outputs, golds)),
            "agreement": statistics.fmean(prefix_agreement(a, b, new_tokens) for a, b in zip(ids, ref_ids))
            if ref_ids else None,
            "top1": statistics.fmean(top1_agreement(a, b) for a, b in zip(ids, ref_ids)) if ref_ids else None,
        })
    return rows


COLUMNS = [("system", "system", "{}"), ("qps", "QPS", "{:g}"), ("chunks", "chunks", "{}"),
           ("reuse_ratio", "reuse", "{:.2f}"),
           ("peak_kv_pages", "peak KV pages", "{:.0f}"), ("mean_kv_pages", "mean KV pages", "{:.0f}"),
           ("peak_kv_mib", "peak KV MiB", "{:.1f}"), ("ttft_p50", "TTFT p50 s", "{:.2f}"),
           ("ttft_p99", "TTFT p99 s", "{:.2f}"), ("compile_wait_p50", "compile wait p50 s", "{:.2f}"),
           ("compile_held", "held for compiles", "{:.0%}"),
           ("e2e_p50", "e2e p50 s", "{:.2f}"), ("e2e_p99", "e2e p99 s", "{:.2f}"),
           ("throughput_rps", "req/s", "{:.2f}"), ("recomputed_tokens", "recomputed tok/req", "{:.0f}"),
           ("prompt_tokens", "prompt tok/req", "{:.0f}"), ("f1", "F1", "{:.3f}"), ("em", "EM", "{:.3f}"),
           ("agreement", "agreement vs full", "{:.3f}"), ("top1", "top-1 vs full", "{:.3f}")]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["reuse"] if r["reuse"] is not None else -1, r["chunks"], r["qps"],
                                         list(SYSTEMS).index(r["system"]))):
        lines.append("| " + " | ".join("—" if r[k] is None else fmt.format(r[k]) for k, _, fmt in COLUMNS) + " |")
    return "\n".join(lines)


LABELS = {"qps": "QPS", "chunks": "chunks per request", "reuse": "reuse (requested share of repeating chunks)",
          "peak_kv_pages": "peak KV pages", "ttft_p50": "TTFT p50 (s)", "ttft_p99": "TTFT p99 (s)"}


def plots(rows: list[dict], out: Path, charts: list[tuple[str, dict]], metrics: list[str]) -> list[Path]:
    """One PNG per (swept variable, metric): a line per system, the other variables held at `fixed`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []
    systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
    for x, fixed in charts:
        for y in metrics:
            fig, ax = plt.subplots(figsize=(6, 4))
            for s in systems:
                pts = sorted((r[x], r[y]) for r in rows
                             if r["system"] == s and all(r[k] == v for k, v in fixed.items()))
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=s)
            ax.set_xlabel(LABELS[x])
            ax.set_ylabel(LABELS[y])
            held = ", ".join(f"{k} = {v:g}" for k, v in fixed.items() if v is not None)
            ax.set_title(f"{LABELS[y]} vs {x} ({held})", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            name = out / f"{y.replace('_pages', '')}_vs_{x}.png"
            fig.savefig(name, dpi=110)
            plt.close(fig)
            made.append(name)
    return made


def grid(args, preset: dict) -> list[tuple[float, int, float | None]]:
    """The (qps, chunks, reuse) points to run, in order."""
    if not args.paper:
        qps = [float(x) for x in args.qps.split(",")] if args.qps else preset["qps"]
        chunks = [int(x) for x in args.chunks.split(",")] if args.chunks else preset["chunks"]
        return [(q, c, args.reuse) for c in chunks for q in qps]
    base = PAPER["base"]
    points = [(base["qps"], base["chunks"], base["reuse"])]
    for sweep in args.sweeps.split(","):
        for v in PAPER.get(sweep, []):  # "base": the base point alone
            point = {**base, sweep: v}
            key = (point["qps"], point["chunks"], point["reuse"])
            if key not in points:
                points.append(key)
    return points


def context_args(model: str, prompt_tokens: dict, page_size: int, new_tokens: int) -> tuple[list[str], dict]:
    """Server flags (and environment) for a context long enough for the longest padded prompt.

    prompt_tokens: (chunks, reuse) -> token count of each prompt; each chunk pads to at most a page more.
    """
    cfg = json.loads((Path(model) / "config.json").read_text())
    longest = max(max(counts) + page_size * c + new_tokens for (c, _), counts in prompt_tokens.items())
    if longest <= cfg.get("max_position_embeddings", 0):
        return [], {}
    length = 1 << math.ceil(math.log2(longest))
    print(f"[server] the longest prompt needs {longest} slots: --context-length {length} "
          f"(the model says {cfg.get('max_position_embeddings')})")
    return ["--context-length", str(length)], {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['requests']} requests at QPS {QUICK['qps']} "
                                                          f"and {QUICK['chunks']} chunks per request")
    ap.add_argument("--paper", action="store_true",
                    help=f"the paper's sweeps: {PAPER['requests']} requests per point around {PAPER['base']}, "
                         f"QPS {PAPER['qps']}, chunks {PAPER['chunks']}, reuse {PAPER['reuse']}; tiny model")
    ap.add_argument("--sweeps", default=",".join(SWEEPS),
                    help="with --paper: which of qps,chunks,reuse to sweep ('base': the base point alone)")
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
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct; "
                                                  "with --paper the tiny random Llama)")
    ap.add_argument("--pool-pages", type=int, default=None,
                    help=f"KV pool size in pages of {MEPIC_PAGE_SIZE} tokens for every server (default: the "
                         f"launcher's CPU default, {DEFAULT_POOL_PAGES:,} pages); a pool the baselines fill caps "
                         "their peak, and with it every ratio against them")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points a stopped run with the same settings saved in --out (points.jsonl) "
                         "and run only the rest")
    args = ap.parse_args(argv)

    if args.paper and (args.quick or args.qps or args.chunks or args.reuse is not None):
        sys.exit("bad arguments: --paper sets QPS, chunks and reuse itself (choose sweeps with --sweeps)")
    if args.pool_pages is not None and args.pool_pages < 64:
        sys.exit(f"bad arguments: --pool-pages {args.pool_pages} (at least 64)")
    if args.paper and not set(args.sweeps.split(",")) <= {*SWEEPS, "base"}:
        sys.exit(f"bad arguments: --sweeps {args.sweeps} (from {', '.join(SWEEPS)}, or base)")
    preset = PAPER if args.paper else QUICK if args.quick else FULL
    points = grid(args, preset)
    n = args.requests or preset["requests"]
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not all(2 <= c <= 16 for _, c, _ in points) or not all(q > 0 for q, _, _ in points):
        sys.exit(f"bad arguments: systems {unknown or 'ok'}, chunks {sorted({c for _, c, _ in points})} (2-16), "
                 f"qps {sorted({q for q, _, _ in points})} (> 0)")
    kind = "paper" if args.paper else "quick" if args.quick else "full"
    out = args.out or Path("eval/results") / f"{args.dataset}-{kind}"
    out.mkdir(parents=True, exist_ok=True)

    from transformers import AutoTokenizer

    # Absolute: the server starts in a directory of its own.
    model = (str(Path(args.model).resolve()) if args.model
             else str(models.build(models.TEST_MODEL if args.paper else models.DEFAULT_MODEL)))
    tokenizer = AutoTokenizer.from_pretrained(model)
    workload = {}
    for c, r in dict.fromkeys((c, r) for _, c, r in points):
        try:
            workload[(c, r)] = (with_reuse(args.dataset, n, c, r, seed=args.seed) if r is not None
                                else DATASETS[args.dataset](n, c, seed=args.seed))
        except ValueError as e:
            if not args.paper:
                sys.exit(f"bad arguments: {e}")
            print(f"[workload] skipped: {e}")  # a sweep point the dataset cannot supply
    points = [p for p in points if (p[1], p[2]) in workload]
    shapes = list(workload)
    texts = {shape: [render(tokenizer, r) for r in reqs] for shape, reqs in workload.items()}
    prompt_tokens = {shape: [len(tokenizer.encode(t, add_special_tokens=False)) for t in ts]
                     for shape, ts in texts.items()}
    ratios, lengths = {}, {}
    for (c, r), reqs in workload.items():
        ratios[(c, r)] = reuse_ratio(reqs, lambda d: tokenizer.encode(d, add_special_tokens=False))
        lengths[(c, r)] = statistics.fmean(prompt_tokens[(c, r)])
        print(f"[workload] {args.dataset}: {n} requests x {c} chunks, reuse ratio {ratios[(c, r)]:.3f} "
              f"(chunk tokens that repeat an earlier chunk), mean prompt {lengths[(c, r)]:.0f} tokens")
    page_size = MEPIC_PAGE_SIZE
    extra, env = context_args(model, prompt_tokens, page_size, args.new_tokens)
    if args.pool_pages:
        extra += ["--max-total-tokens", str(args.pool_pages * page_size)]
    page_bytes = kv_bytes_per_token(model) * page_size
    settings = {"dataset": args.dataset, "requests": n, "new_tokens": args.new_tokens, "seed": args.seed,
                "model": Path(model).name, "pool_pages": args.pool_pages}
    try:
        checkpoint = Checkpoint(out, settings, args.resume)
    except ValueError as e:
        sys.exit(f"bad arguments: --resume: {e}")
    if checkpoint.set_aside:
        print(f"[checkpoint] an earlier run's points were moved to {checkpoint.set_aside} (--resume keeps them)")
    done = {(s, *p): Point.load(record) for s in systems for p in points if (record := checkpoint.get(s, *p))}
    if done:
        print(f"[resume] {len(done)} of {len(systems) * len(points)} (system, point) runs kept from {checkpoint.path}")
    print(f"[checkpoint] each finished point goes to {checkpoint.path}; if this run stops, "
          "the same command with --resume goes on from there")
    last = time.perf_counter()
    with tqdm(total=len(systems) * len(points) * n, initial=len(done) * n, desc="requests", unit="req") as bar:
        for system in systems:
            todo = [p for p in points if (system, *p) not in done]
            if not todo:
                continue
            bar.set_postfix_str(f"{system}: starting server")
            # A short decode log interval keeps SGLang's used-token gauge fresh for the sampler.
            with ServerProcess(model, "--dtype", "float32", "--decode-log-interval", "4", *extra, *SYSTEMS[system],
                               startup_timeout=600, env=env) as server:
                pool = pool_pages(server, page_size)
                for q, c, r in todo:
                    bar.set_postfix_str(f"{system} qps={q:g} chunks={c}" + (f" reuse={r:g}" if r is not None else ""))
                    mark = len(server.log())
                    outputs, pages, exact, seconds = run_point(server, page_size, texts[(c, r)], q,
                                                               args.new_tokens, args.seed, bar)
                    point = Point(system, q, c, r, outputs, pages, exact, seconds,
                                  compile_waits(server.log()[mark:]), pool, time.perf_counter() - last)
                    last = time.perf_counter()
                    checkpoint.add(asdict(point))
                    done[(system, q, c, r)] = point
    results = [done[(s, *p)] for s in systems for p in points]
    minutes = sum(p.wall for p in results) / 60
    invocations = "" if checkpoint.invocations == 1 else f" over {checkpoint.invocations} invocations (--resume)"

    rows = summarize(results, workload, args.new_tokens, page_bytes)
    for row in rows:
        row["reuse_ratio"] = round(ratios[(row["chunks"], row["reuse"])], 4)
        row["mean_prompt_tokens"] = round(lengths[(row["chunks"], row["reuse"])], 1)
    md = table(rows)
    pools = sorted({p.pool_pages for p in results})
    command = "python -m eval.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    shape = ", ".join(f"{ratios[s]:.3f} reused over {lengths[s]:.0f} prompt tokens at {s[0]} chunks"
                      + (f" (reuse {s[1]:g} asked)" if s[1] is not None else "") for s in shapes)
    header = (f"{args.dataset}, {n} requests per point, {args.new_tokens} new tokens, greedy, float32, "
              f"model {Path(model).name}, a KV pool of {' / '.join(f'{size:,}' for size in pools)} pages; "
              f"fidelity against `{REFERENCE}`. Realised reuse ratio (chunk tokens "
              f"that repeat an earlier chunk): {shape}. {len(systems) * len(points) * n} requests in "
              f"{minutes:.0f} min on this machine{invocations}.\n\nCommand: `{command}`\n\n")
    (out / "table.md").write_text(header + md + "\n")
    (out / "results.json").write_text(json.dumps({"command": command, "model": Path(model).name,
                                                  "dataset": args.dataset, "minutes": round(minutes, 1),
                                                  "invocations": checkpoint.invocations,
                                                  "rows": rows}, indent=2))
    print(md)
    print(f"[time] {len(systems) * len(points) * n} requests in {minutes:.1f} min{invocations}")
    if not args.no_plots:
        if args.paper:
            base = PAPER["base"]
            charts = [(x, {k: v for k, v in base.items() if k != x}) for x in args.sweeps.split(",") if x in SWEEPS]
            metrics = ["peak_kv_pages", "ttft_p50", "ttft_p99"]
        else:
            qs, cs = sorted({q for q, _, _ in points}), sorted({c for _, c, _ in points})
            charts = [("qps", {"chunks": cs[-1]}), ("chunks", {"qps": qs[0]})]
            metrics = ["peak_kv_pages", "ttft_p50"]
        for p in plots(rows, out, charts, metrics):
            print(f"[plot] {p}")
    print(f"[results] {out}/table.md, {out}/results.json")


if __name__ == "__main__":
    main()
