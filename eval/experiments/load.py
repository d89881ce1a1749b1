"""Load test: many clients, chunked and plain prompts, a device pool small enough to force eviction.

    .venv/bin/python -m eval.experiments.load                  # 500 requests from 16 clients, host tier on
    .venv/bin/python -m eval.experiments.load --compare        # the same workload without, then with, the host tier
    .venv/bin/python -m eval.experiments.load --compare --out eval/results/load   # the committed run
    .venv/bin/python -m eval.experiments.load --model smollm2 --requests 200
    .venv/bin/python -m eval.experiments.load --cluster 2      # through sglang-router: each policy, shared tier on

A fresh server (loopback, free port) serves each run (`--url URL`: one run, on the server at URL). Three requests in four carry
2-4 chunks drawn Zipf-like from a pool of chunks whose KV is several times the
device pool, so chunks are evicted and come back; the rest are plain prompts. Half
of the requests stream, and a few streamed ones are dropped by their client after
the first chunk (deliberate aborts). Every response is checked; the run ends with
the device and host pools as they stand, the hit rate of each tier, the tokens
spent compiling chunks, and a flush that must return the free pages to their start.

With --cluster N the same workload goes through N instances behind sglang-router
(sglang_mepic.launch_cluster), once per routing policy with Mooncake Store as the
shared chunk tier, and once as N independent servers (no shared tier, round
robin) for comparison. `manual` is sglang-router's sticky policy steered by the
request's first chunk: the client sends that chunk's hash as `x-smg-routing-key`.
Chunked prompts open with one shared instruction (as RAG prompts do) rather than
their request number, so prefix-aware routing (`cache_aware`) sees their chunks.
Each run reports the cluster's compiled tokens, each tier's hit rate summed over
the instances, TTFT of the streamed requests, failures, and each instance's free
pages after a flush.

Output (under --out; without it the scratch folder eval/results/local/load or eval/results/local/cluster,
git-ignored; the committed runs: `--out eval/results/load`, `--out eval/results/cluster`):
results.json, table.md and a PNG (device and host pages over time and compiled
tokens per run; with --cluster, compiled tokens and TTFT per run).
"""

import argparse
import hashlib
import json
import os
import random
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import requests
from tqdm import tqdm

from eval.experiments.run import flush
from eval.lib import provenance, served
from eval.lib.outputs import out_dir
from eval.lib.workloads import zipf_weights
from sglang_mepic.lang import chunk
from sglang_mepic.launch import models
from sglang_mepic.launch.cluster import Cluster

TIERS = ("device", "host", "storage", "absent")


@dataclass
class Job:
    text: str
    chunks: int
    stream: bool
    disconnect: bool
    new_tokens: int
    route: str = ""  # the first chunk's hash: a routing key that follows the chunks


def corpus_words() -> list[str]:
    """Plain English-like text that ships with Python: its own source."""
    words = []
    for module in (os, argparse, json, threading):
        words += open(module.__file__, encoding="utf-8").read().split()
    return words


def workload(n: int, pool: int, seed: int, chunked_share: float = 0.75, disconnect_rate: float = 0.03,
             numbered: bool = True) -> list[Job]:
    """numbered: each prompt opens with its request number, so no two share a prefix; without it
    chunked prompts open with the same instruction, as RAG prompts do (what prefix-aware routing sees)."""
    rng = random.Random(seed)
    words = corpus_words()
    docs = []
    for _ in range(pool):
        start, size = rng.randrange(len(words) - 400), rng.randint(60, 180)
        docs.append(" ".join(words[start:start + size]))
    weights = zipf_weights(pool, 0.8)
    jobs = []
    for i in range(n):
        stream = rng.random() < 0.5
        if rng.random() < chunked_share:
            picked = []
            for _ in range(rng.randint(2, 4)):
                doc = rng.choices(range(pool), weights)[0]
                if doc not in picked:
                    picked.append(doc)
            text = ((f"Request {i}. " if numbered else "") + "Answer from the documents.\n"
                    + "".join(chunk(docs[d]) for d in picked)
                    + f"\nQuestion {rng.randrange(1000)}: what is it about?")
        else:
            start = rng.randrange(len(words) - 300)
            text, picked = " ".join(words[start:start + rng.randint(40, 300)]), []
        route = hashlib.sha1(docs[picked[0]].encode()).hexdigest()[:16] if picked else ""
        jobs.append(Job(text, len(picked), stream, stream and rng.random() < disconnect_rate,
                        rng.randint(4, 16), route))
    return jobs


@dataclass
class Outcome:
    status: str  # ok | aborted (deliberately) | failed
    detail: str = ""
    residency: list = field(default_factory=list)
    ttft: float | None = None  # streamed requests: seconds to the first token


def send(url: str, job: Job, route: bool = False) -> Outcome:
    body = {"text": job.text, "stream": job.stream,
            "sampling_params": {"max_new_tokens": job.new_tokens, "temperature": 0, "ignore_eos": True}}
    headers = {"x-smg-routing-key": job.route} if route and job.route else {}
    started, ttft = time.perf_counter(), None
    try:
        with requests.post(url + "/generate", json=body, stream=job.stream, timeout=600, headers=headers) as r:
            if r.status_code != 200:
                return Outcome("failed", f"HTTP {r.status_code}: {r.text[:200]}")
            if not job.stream:
                out = r.json()
            else:
                out = None
                for line in r.iter_lines():
                    if not line.startswith(b"data:") or line == b"data: [DONE]":
                        continue
                    out = json.loads(line[5:])
                    if ttft is None:
                        ttft = time.perf_counter() - started
                    if "error" in out:
                        return Outcome("failed", str(out["error"])[:200])
                    if job.disconnect:
                        return Outcome("aborted")  # closing the response drops the connection mid-stream
            if out is None:
                return Outcome("failed", "empty stream")
            meta = out["meta_info"]
            if meta.get("finish_reason", {}).get("type") not in ("length", "stop"):
                return Outcome("failed", f"finish_reason {meta.get('finish_reason')}")
            if meta["completion_tokens"] != job.new_tokens:
                return Outcome("failed", f"{meta['completion_tokens']} tokens, asked for {job.new_tokens}")
            residency = meta.get("mepic_residency", [])
            if job.chunks and len(residency) != job.chunks:
                return Outcome("failed", f"residency {residency} for {job.chunks} chunks")
            return Outcome("ok", residency=residency, ttft=ttft)
    except requests.RequestException as e:
        return Outcome("failed", f"{type(e).__name__}: {e}"[:200])


def mepic_state(url: str) -> dict:
    return requests.get(url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def settled(url: str, timeout: float = 120) -> dict:
    """The cache figures once no request holds pages (dropped streams take a moment to abort)."""
    deadline = time.time() + timeout
    while (state := mepic_state(url))["kv_pages_in_use"] and time.time() < deadline:
        time.sleep(0.5)
    return state


class Sampler(threading.Thread):
    """Device pages in use and host pages used, once a second."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url, self.samples, self.stop_event = url, [], threading.Event()
        self.start_time = time.time()

    def run(self):
        while not self.stop_event.wait(1.0):
            try:
                s = mepic_state(self.url)
            except requests.RequestException:
                continue
            self.samples.append((round(time.time() - self.start_time, 1), s["kv_pages_in_use"],
                                 s["kv_pages_total"] - s["kv_pages_free"], s.get("host_pages_used", 0)))


def drive(url: str, jobs: list[Job], clients: int, time_limit: float, label: str,
          route: bool = False) -> tuple[list[Outcome | None], float]:
    """Send the jobs from `clients` threads; what is not sent within `time_limit` seconds stays None."""
    outcomes: list[Outcome | None] = [None] * len(jobs)
    began = time.time()
    with tqdm(total=len(jobs), desc=label, unit="req") as bar, ThreadPoolExecutor(clients) as pool:
        def client(i):
            if time.time() < began + time_limit:
                outcomes[i] = send(url, jobs[i], route)
            bar.update(1)
        list(pool.map(client, range(len(jobs))))
    return outcomes, time.time() - began


def tally(outcomes: list[Outcome | None]) -> dict:
    statuses = Counter(o.status if o else "not sent" for o in outcomes)
    residency = Counter(r for o in outcomes if o for r in o.residency)
    return {"requests": len(outcomes), "ok": statuses["ok"], "aborted": statuses["aborted"],
            "failed": statuses["failed"], "not_sent": statuses["not sent"],
            "failures": [o.detail for o in outcomes if o and o.status == "failed"][:20],
            "segments_by_residency": {t: residency[t] for t in TIERS}}


def markdown(caption: str, runs: list[dict], rows: list) -> str:
    """One column per run, one line per (name, figure of a run) row."""
    lines = [caption, "", "| | " + " | ".join(r["label"] for r in runs) + " |", "|---|" + "---|" * len(runs)]
    lines += [f"| {name} | " + " | ".join(str(f(r)) for r in runs) + " |" for name, f in rows]
    return "\n".join(lines) + "\n"


def run(label: str, model: str, server_args: list[str], jobs: list[Job], clients: int, time_limit: float,
        url: str | None = None) -> dict:
    with served.server(url, model, *server_args, startup_timeout=600) as server:
        flush(server.url)
        start = mepic_state(server.url)
        sampler = Sampler(server.url)
        sampler.start()
        outcomes, seconds = drive(server.url, jobs, clients, time_limit, label)
        sampler.stop_event.set()
        sampler.join()
        end = settled(server.url)  # the pools as the load left them
        flush(server.url)
        after_flush = mepic_state(server.url)
        alive = requests.post(server.url + "/generate", timeout=60, json={
            "text": "still there?", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    return {
        "label": label, "server_args": server_args, "seconds": round(seconds, 1), **tally(outcomes),
        "free_pages_start": start["kv_pages_free"], "free_pages_after_flush": after_flush["kv_pages_free"],
        "server_answers_after": alive, "end": end, "timeline": sampler.samples,
    }


COUNTERS = ("compiled_tokens", "recomputed_tokens", "chunks_compiled", "tier_loads_host", "tier_loads_storage",
            "storage_written", "storage_rejected", *(f"tier_lookups_{t}" for t in TIERS))


def run_cluster(label: str, model: str, server_args: list[str], jobs: list[Job], clients: int, time_limit: float,
                instances: int, storage: str, policy: str) -> dict:
    with Cluster(model, instances, storage, policy, server_args=tuple(server_args)) as cluster:
        urls = [s.url for s in cluster.servers]
        for url in urls:
            flush(url)
            deadline = time.time() + 60
            while storage != "none" and mepic_state(url)["storage_state"] != "up":
                if time.time() > deadline:
                    raise RuntimeError(f"{url}: the shared tier never came up ({mepic_state(url)})")
                time.sleep(0.5)
        start = [mepic_state(url) for url in urls]
        outcomes, seconds = drive(cluster.url, jobs, clients, time_limit, label, route=policy == "manual")
        ends = [settled(url) for url in urls]
        for url in urls:
            flush(url)
        after_flush = [mepic_state(url) for url in urls]
        alive = requests.post(cluster.url + "/generate", timeout=60, json={
            "text": "still there?", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    per_instance = [{k: e.get(k, 0) - s.get(k, 0) for k in COUNTERS} for s, e in zip(start, ends)]
    total = {k: sum(i[k] for i in per_instance) for k in COUNTERS}
    lookups = sum(total[f"tier_lookups_{t}"] for t in TIERS)
    ttfts = sorted(o.ttft for o in outcomes if o and o.ttft is not None)
    return {
        "label": label, "policy": policy, "storage": storage, "instances": instances, "seconds": round(seconds, 1),
        **tally(outcomes), "cluster": total, "hit_rate": {t: round(total[f"tier_lookups_{t}"] / lookups, 4) if lookups else 0.0
                                       for t in TIERS},
        "lookups_per_instance": [sum(i[f"tier_lookups_{t}"] for t in TIERS) for i in per_instance],
        "ttft_p50": round(ttfts[len(ttfts) // 2], 3) if ttfts else None,
        "ttft_p99": round(ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))], 3) if ttfts else None,
        "free_pages_start": [s["kv_pages_free"] for s in start],
        "free_pages_after_flush": [a["kv_pages_free"] for a in after_flush],
        "server_answers_after": alive, "per_instance": per_instance,
    }


def cluster_table(report: dict) -> str:
    rows = [("requests (ok / deliberately aborted / failed / not sent)",
             lambda r: f"{r['requests']} ({r['ok']} / {r['aborted']} / {r['failed']} / {r['not_sent']})"),
            ("wall time (s)", lambda r: r["seconds"]),
            ("TTFT p50 / p99 (s, streamed requests)", lambda r: f"{r['ttft_p50']} / {r['ttft_p99']}"),
            ("compiled tokens, whole cluster", lambda r: r["cluster"]["compiled_tokens"]),
            ("chunks compiled, whole cluster", lambda r: r["cluster"]["chunks_compiled"]),
            ("chunk lookups hit: device / host / storage / absent",
             lambda r: " / ".join(f"{r['hit_rate'][t]:.3f}" for t in TIERS)),
            ("chunks loaded from storage / written to it",
             lambda r: f"{r['cluster']['tier_loads_storage']} / {r['cluster']['storage_written']}"),
            ("chunk lookups per instance", lambda r: " / ".join(str(n) for n in r["lookups_per_instance"])),
            ("free pages per instance: start / after flush",
             lambda r: ", ".join(f"{a} / {b}" for a, b in zip(r["free_pages_start"], r["free_pages_after_flush"]))),
            ("cluster answers afterwards", lambda r: r["server_answers_after"])]
    return markdown(f"`{report['command']}` ({report['model']}, {report['instances']} instances on this machine, "
                    f"{report['clients']} clients, {report['requests']} requests, {report['chunked_requests']} "
                    f"chunked, {report['streamed']} streamed)", report["runs"], rows)


def cluster_plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4))
    labels = [r["label"] for r in runs]
    ax.bar(labels, [r["cluster"]["compiled_tokens"] for r in runs], color="tab:orange")
    ax.set_ylabel("tokens compiled, whole cluster")
    bx.bar(labels, [r["ttft_p50"] or 0 for r in runs], color="tab:blue", label="p50")
    bx.scatter(labels, [r["ttft_p99"] or 0 for r in runs], color="black", marker="_", s=400, label="p99")
    bx.set_ylabel("TTFT (s, streamed requests)")
    bx.legend()
    for a in (ax, bx):
        a.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main_cluster(args, argv, model: str, jobs: list[Job], base: list[str]) -> None:
    base = base + ["--mepic-host-tier-gb", str(args.host_tier_gb)]
    n = args.cluster
    runs = [run_cluster(f"{n} independent servers", model, base, jobs, args.clients, args.time_limit, n,
                        "none", "round_robin")]
    for policy in args.policies.split(","):
        label = f"{policy}" + (" (first chunk's key)" if policy == "manual" else "") + ", mooncake"
        runs.append(run_cluster(label, model, base, jobs, args.clients, args.time_limit, n, "mooncake", policy))
    out = out_dir(args.out, "cluster")
    out.mkdir(parents=True, exist_ok=True)
    report = {"command": provenance.command("eval.experiments.load", argv if argv is not None else sys.argv[1:]),
              "model": provenance.portable(args.model), "instances": n, "clients": args.clients, "requests": len(jobs),
              "chunked_requests": sum(1 for j in jobs if j.chunks), "streamed": sum(1 for j in jobs if j.stream),
              "runs": runs}
    (out / "results.json").write_text(json.dumps(report, indent=1))
    text = cluster_table(report)
    (out / "table.md").write_text(text)
    cluster_plot(runs, out / "cluster.png")
    print(text)
    print(f"wrote {out}/results.json, table.md, cluster.png")
    if any(r["failed"] or r["not_sent"] or r["free_pages_after_flush"] != r["free_pages_start"]
           or not r["server_answers_after"] for r in runs):
        sys.exit(1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=models.TEST_MODEL,
                   help=f"{models.TEST_MODEL} (random weights, fast), {models.DEFAULT_MODEL}, or a model folder")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--chunk-pool", type=int, default=40, help="distinct chunks the requests draw from")
    p.add_argument("--max-total-tokens", type=int, default=4096, help="device KV pool, in tokens")
    p.add_argument("--host-tier-gb", type=float, default=0.25)
    p.add_argument("--compare", action="store_true", help="run the workload without the host tier too")
    p.add_argument("--time-limit", type=float, default=900, help="seconds per run; later requests are not sent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cluster", type=int, default=0, metavar="N",
                   help="send the load through N instances behind sglang-router (see above)")
    p.add_argument("--policies", default="round_robin,cache_aware,power_of_two,manual",
                   help="with --cluster: sglang-router policies to run, each with the shared tier")
    p.add_argument("--out", type=Path, default=None, help="default: the scratch folder eval/results/local/load "
                   "(with --cluster eval/results/local/cluster), git-ignored")
    served.add_url(p)
    args = p.parse_args(argv)
    if args.url and (args.compare or args.cluster):
        p.error("--url runs the workload once, on that server: not with --compare or --cluster")

    model = str(models.build(args.model)) if args.model in models.BUILDERS else args.model
    jobs = workload(args.requests, args.chunk_pool, args.seed, numbered=not args.cluster)
    base = ["--dtype", "float32", "--max-total-tokens", str(args.max_total_tokens)]
    if args.cluster:
        return main_cluster(args, argv, model, jobs, base)
    args.out = out_dir(args.out, "load")
    runs = []
    if args.url:
        runs.append(run(f"the server at {args.url}", model, base, jobs, args.clients, args.time_limit, args.url))
    if args.compare:
        runs.append(run("no host tier", model, base, jobs, args.clients, args.time_limit))
    if not args.url:
        runs.append(run(f"host tier {args.host_tier_gb:g} GB", model,
                        base + ["--mepic-host-tier-gb", str(args.host_tier_gb)], jobs, args.clients, args.time_limit))

    args.out.mkdir(parents=True, exist_ok=True)
    report = {"command": provenance.command("eval.experiments.load", argv if argv is not None else sys.argv[1:]),
              "model": provenance.portable(args.model), "clients": args.clients, "chunked_requests": sum(1 for j in jobs if j.chunks),
              "streamed": sum(1 for j in jobs if j.stream), "runs": runs}
    (args.out / "results.json").write_text(json.dumps(report, indent=1))
    text = table(report)
    (args.out / "table.md").write_text(text)
    plot(runs, args.out / "load.png")
    print(text)
    print(f"wrote {args.out}/results.json, table.md, load.png")
    if any(r["failed"] or r["not_sent"] or r["free_pages_after_flush"] != r["free_pages_start"]
           or not r["server_answers_after"] for r in runs):
        sys.exit(1)


def table(report: dict) -> str:
    rows = [("requests (ok / deliberately aborted / failed / not sent)",
             lambda r: f"{r['requests']} ({r['ok']} / {r['aborted']} / {r['failed']} / {r['not_sent']})"),
            ("wall time (s)", lambda r: r["seconds"]),
            ("chunk lookups: device / host / storage / absent",
             lambda r: " / ".join(str(r["end"].get(f"tier_lookups_{t}", 0)) for t in TIERS)),
            ("hit rate: device / host / storage",
             lambda r: " / ".join(f"{r['end'].get(f'tier_hit_rate_{t}', 0):.3f}" for t in TIERS[:3])),
            ("chunk segments served from device / host / storage / absent",
             lambda r: " / ".join(str(r["segments_by_residency"][t]) for t in TIERS)),
            ("compiled tokens", lambda r: r["end"]["compiled_tokens"]),
            ("recomputed tokens (in requests)", lambda r: r["end"]["recomputed_tokens"]),
            ("device pool at the end: pages total / free / in use / chunk pages / chunks",
             lambda r: "{kv_pages_total} / {kv_pages_free} / {kv_pages_in_use} / {canonical_chunk_pages} / "
                       "{chunks_resident}".format(**r["end"])),
            ("device chunk evictions", lambda r: r["end"]["chunk_evictions"]),
            ("host pool at the end: pages used / total / chunks / evictions",
             lambda r: "{host_pages_used} / {host_pages_total} / {host_chunks} / {host_evictions}".format(**r["end"])
             if "host_pages_total" in r["end"] else "-"),
            ("free pages: start / after flush", lambda r: f"{r['free_pages_start']} / {r['free_pages_after_flush']}"),
            ("server answers afterwards", lambda r: r["server_answers_after"])]
    return markdown(f"`{report['command']}` ({report['model']}, {report['clients']} clients, "
                    f"{report['chunked_requests']} chunked requests, {report['streamed']} streamed)",
                    report["runs"], rows)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    for r in runs:
        t = [s[0] for s in r["timeline"]]
        ax.plot(t, [s[2] for s in r["timeline"]], label=f"{r['label']}: device pages allocated")
        ax.plot(t, [s[1] for s in r["timeline"]], linestyle=":", label=f"{r['label']}: device pages in use")
        if any(s[3] for s in r["timeline"]):
            ax.plot(t, [s[3] for s in r["timeline"]], linestyle="--", label=f"{r['label']}: host pages used")
    ax.axhline(runs[0]["end"]["kv_pages_total"], color="gray", linewidth=0.8, label="device pool size")
    ax.set_xlabel("seconds")
    ax.set_ylabel("pages")
    ax.legend(fontsize=7)
    bx.bar([r["label"] for r in runs], [r["end"]["compiled_tokens"] for r in runs], color="tab:orange")
    bx.set_ylabel("tokens compiled")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
