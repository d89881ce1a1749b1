"""RAG evaluation: MEPIC against EPIC, CacheBlend, naive reuse and SGLang's prefix cache.

    .venv/bin/python -m eval.experiments.run --quick            # every system, 2 QPS x 2 context lengths, < 15 min
    .venv/bin/python -m eval.experiments.run --quick --out eval/results/squad-quick   # the same, as committed
    .venv/bin/python -m eval.experiments.run                    # the full sweep (more QPS values and lengths)
    .venv/bin/python -m eval.experiments.run --dataset hotpotqa --qps 0.5,1 --chunks 4,8 --requests 24
    .venv/bin/python -m eval.experiments.run --reuse 0.85 --chunks 6 --requests 300   # a set share of chunks repeating
    .venv/bin/python -m eval.experiments.run --paper [--dataset hotpotqa] [--sweeps qps,chunks,reuse] [--out DIR]

`--paper` runs the MEPIC paper's sweeps at its scale: 300 requests per point, the
SQuAD shape of its Table 1 (about 85% of chunk tokens reused, about 2.2k prompt
tokens: 7 chunks) as the base point, and one variable swept at a time: QPS (light
load to past this machine's saturation), chunks per request (2-16) and reuse
(0.3-0.95). It serves the tiny random Llama: pages, reuse and scheduling do not
depend on model quality, and it is fast enough on 2 cores for 300-request points.
Fidelity is measured apart, on SmolLM2 (eval.experiments.fidelity).

Each system gets a fresh server (SmolLM2-135M-Instruct, float32, greedy); between
sweep points its cache is flushed. Requests arrive open-loop (Poisson at the
given QPS) and stream, so TTFT is measured at the first token. KV memory is
sampled from the server's Prometheus `/metrics` (SGLang's used-token gauge,
which for the mepic cache counts what eviction cannot free) ten times a second,
and for the mepic cache its exact peak is read from `/server_info` too. A chunk
no tier holds is computed in the batch of the request that first reads it (no
request waits a round for it); `compiling` is the share of requests that
computed one, and TTFT p50 is also given apart for those and for the others.

Output (under --out; without it the scratch folder eval/results/local/<dataset>-quick, -full or -paper,
git-ignored, so that a --quick or trial run never replaces a committed one: a run to commit names its folder,
`--out eval/results/squad-quick`, eval/lib/outputs.py): table.md,
results.json (every figure, the command, its kind and the model) and PNG plots: peak KV
pages and TTFT p50 (with --paper also p99) against each swept variable. Each
finished (system, point) is saved to points.jsonl there as it ends; if a run
stops, the same command with --resume runs only what is missing, and with
--tables-only writes the tables from what it kept, running nothing. A finished
run packs points.jsonl into points.jsonl.xz, the file that is committed.
"""

import argparse
import json
import math
import random
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import requests
from tqdm import tqdm

from eval.lib import anatomy, provenance, served
from eval.lib.checkpoint import Checkpoint
from eval.lib.outputs import out_dir
from eval.lib.scoring import contains, exact_match, f1, prefix_agreement, top1_agreement
from eval.lib.workloads import DATASETS, render, reuse_ratio, with_reuse
from sglang_mepic.launch import models
from sglang_mepic.launch.defaults import CPU_MAX_TOTAL_TOKENS
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE
from sglang_mepic.process.server_process import ServerProcess

SYSTEMS = {
    "vanilla": ["--attention-backend", "torch_native", "--radix-cache-backend", "sglang"],
    "full": ["--mepic-mode", "full"],
    "naive": ["--mepic-mode", "naive"],
    "epic-16": ["--mepic-mode", "epic-16"],
    # EPIC as on LMCache's CPU backend: its chunks in the host tier only, each request's copy loaded into the pool.
    "epic-16-host": ["--mepic-mode", "epic-16", "--mepic-chunk-store", "host"],
    "cacheblend-0.15": ["--mepic-mode", "cacheblend-0.15"],
    "mepic": ["--mepic-mode", "mepic"],
}
REFERENCE = "full"  # fidelity is measured against it
# The position-independent systems: they keep chunk KV, and each gets the same host tier.
PIC = ("naive", "epic-16", "epic-16-host", "cacheblend-0.15", "mepic")
# CacheBlend here runs every token through every layer (SGLang's model runner cannot narrow the
# token set between layers): its attention and memory are CacheBlend's, its compute is not.
EMULATED = {"cacheblend-0.15": "every token runs every layer: its TTFT is an upper bound on CacheBlend's, "
                               "its recomputed tok/req what CacheBlend would compute"}
# A row whose pinned peak comes this close to the pool was capped by it: SGLang admits a request
# only when its pages fit, so a saturated pool peaks a little below its size.
CAPPED_SHARE = 0.95
DEFAULT_HOST_TIER_GB = 1.0
# Per-point deltas of the cache's cumulative counters (/server_info), for every PIC row.
COUNTERS = ("chunks_compiled", "chunk_evictions", "tier_loads_host", "tier_loads_storage", "private_copy_fallbacks")
QUICK = {"qps": [0.5, 2.0], "chunks": [2, 6], "requests": 8}
FULL = {"qps": [0.25, 0.5, 1.0, 2.0, 4.0], "chunks": [2, 4, 8, 16], "requests": 24}
# The paper's sweeps around its SQuAD row (Table 1: 84.9% reused, 2,224 prompt tokens).
PAPER = {"base": {"qps": 2.0, "chunks": 7, "reuse": 0.85}, "requests": 300,
         "qps": [1.0, 2.0, 4.0, 8.0, 16.0], "chunks": [2, 4, 8, 16], "reuse": [0.3, 0.5, 0.7, 0.85, 0.95]}
SWEEPS = ("qps", "chunks", "reuse")
# No system fills it at the sweeps' loads below saturation (the 4-layer tiny model: 2 KiB per token).
PAPER_POOL_PAGES = 16384
DEFAULT_POOL_PAGES = CPU_MAX_TOTAL_TOKENS // MEPIC_PAGE_SIZE
USED_TOKENS = re.compile(r"^sglang:num_used_tokens\{[^}]*\} ([0-9.e+]+)$", re.M)
AVAILABLE_TOKENS = re.compile(r"^sglang:kv_available_tokens\{[^}]*\} ([0-9.e+]+)$", re.M)


@dataclass
class Point:
    """One system at one (QPS, chunks, reuse) point."""
    system: str
    qps: float
    chunks: int
    reuse: float | None = None  # the requested share of repeating chunks (None: the dataset's own draw)
    outputs: list = field(default_factory=list)  # (output_ids, text, meta_info, ttft, e2e, sent) per request
    used_pages: list = field(default_factory=list)  # sampled KV pages in use
    exact_peak: int | None = None
    seconds: float = 0.0
    compile_waits: list = field(default_factory=list)  # unused since issue 47 (no request waits for a compile)
    pool_pages: int = 0  # the KV pool the server reported
    wall: float = 0.0  # seconds since the point before it ended, server start included
    seed: int = 0  # the workload draw and the arrivals
    occupied_pages: list = field(default_factory=list)  # sampled pages not free: pinned + tree + chunk store
    counters: dict = field(default_factory=dict)  # COUNTERS over the point (PIC systems)
    host_tier_gb: float = 0.0
    anatomy: dict = field(default_factory=dict)  # where the pages went (eval/lib/anatomy.py: peak, mean, series)

    @classmethod
    def load(cls, record: dict) -> "Point":
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})


class Sampler(threading.Thread):
    """Polls the used-token gauge while a point runs, and every `anatomy_period` s where the pool's pages
    go (/server_info's page_anatomy: sglang_mepic/pages/anatomy.py). The anatomy is gathered in the
    scheduler's loop, a pass over the used pages, so it is sampled less often than the gauge."""

    def __init__(self, url: str, page_size: int, pool_pages: int | None = None, period: float = 0.1,
                 anatomy_period: float = 0.5):
        super().__init__(daemon=True)
        self.url, self.page_size, self.pool_pages, self.period = url, page_size, pool_pages, period
        self.anatomy_period = anatomy_period
        self.pages: list[float] = []  # pinned: what eviction cannot free
        self.occupied: list[float] = []  # not free: pinned, the prefix tree and the chunk store
        self.anatomy: list[dict] = []  # page_anatomy samples, each with `t` (s from the start)
        self.stop = threading.Event()

    def run(self):
        start, next_anatomy = time.perf_counter(), 0.0
        while not self.stop.is_set():
            now = time.perf_counter() - start
            if self.anatomy_period and now >= next_anatomy:
                next_anatomy = now + self.anatomy_period
                if (sample := page_anatomy(self.url)) is not None:
                    self.anatomy.append({"t": round(now, 2), **anatomy.in_pages(sample, self.page_size)})
            try:
                text = requests.get(self.url + "/metrics", timeout=5).text
                if m := USED_TOKENS.search(text):
                    self.pages.append(float(m.group(1)) / self.page_size)
                if self.pool_pages and (m := AVAILABLE_TOKENS.search(text)):
                    self.occupied.append(self.pool_pages - float(m.group(1)) / self.page_size)
            except requests.RequestException:
                pass
            self.stop.wait(self.period)


# The meta_info a request keeps (the checkpoint is committed: SGLang's other fields tripled its size).
META = ("prompt_tokens", "completion_tokens", "cached_tokens", "finish_reason", "queue_time",
        "forward_entry_time", "prefill_finished_time")


def kept_meta(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if k in META or (k.startswith("mepic_") and k != "mepic_chunks")}


class Refused(Exception):
    """The server answered a request with an error object in its stream, as SGLang streams a 4xx (e.g. a
    request that needs more KV slots than the server takes in one request): what it said, when it was sent
    and how long the answer took."""

    def __init__(self, message: str, e2e: float, sent: float):
        super().__init__(message)
        self.e2e, self.sent = e2e, sent

    def output(self) -> tuple:
        """The request as run_point reports it: no tokens, no first token, finish reason `refused`."""
        return None, "", {"finish_reason": {"type": "refused", "message": str(self)}}, None, self.e2e, self.sent


def stream(url: str, text: str, new_tokens: int, ignore_eos: bool = False):
    """Send one streaming request; returns (output_ids, text, meta_info, ttft, e2e, sent at (wall clock)).
    Raises Refused when the stream ends in an error object instead of an output."""
    sent = time.time()
    t0 = time.perf_counter()
    ttft, last = None, None
    with requests.post(url + "/generate", stream=True, timeout=900, json={
            "text": text, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": ignore_eos}}) as r:
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
    if last is None or "output_ids" not in last:
        error = (last or {}).get("error")
        raise Refused(error.get("message", str(error)) if isinstance(error, dict) else str(error or "no output"),
                      time.perf_counter() - t0, sent)
    return last["output_ids"], last["text"], kept_meta(last["meta_info"]), ttft, time.perf_counter() - t0, sent


def internal_state(url: str, timeout: float = 60) -> dict:
    """The scheduler's state from /server_info (its `mepic` figures, its `page_anatomy`)."""
    return requests.get(url + "/server_info", timeout=timeout).json()["internal_states"][0]


def page_anatomy(url: str) -> dict | None:
    """Where the pool's pages go now (sglang_mepic/pages/anatomy.py), or None if the server did not say."""
    try:
        return internal_state(url, timeout=30).get("page_anatomy")
    except (requests.RequestException, ValueError, KeyError, IndexError):
        return None


def mepic_stats(server) -> dict:
    return internal_state(server.url).get("mepic", {})


def tiered(system: str, flags: list[str], host_tier_gb: float) -> tuple[list[str], float]:
    """A system's server flags with the host tier it gets (every PIC system the same), and the tier's size."""
    tier = host_tier_gb if system in PIC else 0.0
    return [*flags, *(["--mepic-host-tier-gb", f"{tier:g}"] if tier else [])], tier


def flush(url: str, timeout: float = 120) -> None:
    """Flush once the server is idle (SGLang refuses while requests are in flight, aborted ones included)."""
    deadline = time.time() + timeout
    while requests.post(url + "/flush_cache", timeout=60).status_code != 200:
        if time.time() > deadline:
            raise RuntimeError("the server never became idle enough to flush its cache")
        time.sleep(0.5)


def arrival_times(n: int, qps: float, seed: int) -> list[float]:
    """Poisson arrivals: the seconds after the start at which each of n requests is sent."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        arrivals.append(t)
        t += rng.expovariate(qps)
    return arrivals


def run_point(server, page_size: int, pool: int, texts: list[str], qps: float, new_tokens: int, seed: int,
              bar: tqdm, ignore_eos: bool = False, watch=None, clients: int | None = None,
              refusals: bool = False) -> tuple[list, Sampler, int | None, float, dict]:
    """Send texts at Poisson arrivals (`qps`) on a flushed cache, or, with `clients`, from that many clients
    that each send their next request when the last one ends (a closed loop: `clients` requests in flight
    throughout, whatever each system's speed). `watch` (optional) is told of each request as it is sent and as
    it ends (`watch.sent(i)`, `watch.done(i, output)`); once its `stop` event is set, the requests not yet sent
    stay None and the ones in flight are aborted, so a probe whose verdict is known ends early. With `refusals`, a
    request the server refuses (`Refused`: more KV than it takes in one request, say) is reported as
    `Refused.output()` and the run goes on; without, the refusal stops it."""
    flush(server.url)
    before = mepic_stats(server)
    arrivals = [0.0] * len(texts) if clients else arrival_times(len(texts), qps, seed)
    sampler = Sampler(server.url, page_size, pool)
    sampler.start()
    start = time.perf_counter()

    # Set by the watch (a probe that ended early) or by an interrupt: nothing more is sent, at once.
    halt = watch.stop if watch is not None else threading.Event()

    def send(i):
        if halt.wait(max(0.0, start + arrivals[i] - time.perf_counter())):
            return None
        if watch is not None:
            watch.sent(i)
        try:
            out = stream(server.url, texts[i], new_tokens, ignore_eos)
        except Refused as refused:
            if watch is not None and watch.stop.is_set():
                return None  # aborted by the watch
            if not refusals:
                raise
            out = refused.output()
        except (requests.RequestException, KeyError, TypeError):
            if watch is None or not watch.stop.is_set():
                raise
            return None  # aborted by the watch
        bar.update()
        if watch is not None:
            watch.done(i, out)
        return out

    if clients:
        order, lock, outputs = iter(range(len(texts))), threading.Lock(), [None] * len(texts)

        def client():
            while True:
                with lock:
                    i = next(order, None)
                if i is None:
                    return
                outputs[i] = send(i)

    pool = ThreadPoolExecutor(clients or len(texts))
    try:
        if clients:
            for running in [pool.submit(client) for _ in range(clients)]:
                running.result()
        else:
            outputs = list(pool.map(send, range(len(texts))))
    except BaseException:
        _interrupted(server, halt)  # before the pool waits for its threads
        raise
    finally:
        pool.shutdown(wait=True)
    seconds = time.perf_counter() - start
    time.sleep(2 * sampler.period)
    sampler.stop.set()
    sampler.join()
    if watch is not None and watch.stop.is_set():
        flush(server.url)  # the aborted requests' pages, before the counters are read
    after = mepic_stats(server)
    counters = {k: after[k] - before.get(k, 0) for k in COUNTERS if k in after}
    return outputs, sampler, after.get("kv_pages_in_use_peak"), seconds, counters


def _interrupted(server, halt: threading.Event) -> None:
    """Ctrl-C (or SIGTERM, which eval.experiments.capacity turns into it) mid-run: the threads still waiting to
    send give up and the requests in flight are aborted, so the pool's threads end and the run stops."""
    halt.set()
    try:
        abort_all(server.url)
    except requests.RequestException:
        pass


def abort_all(url: str) -> None:
    """Abort every request in flight (SGLang's admin endpoint); their streams end."""
    requests.post(url + "/abort_request", json={"abort_all": True}, timeout=60).raise_for_status()


def pool_pages(server, page_size: int) -> int:
    """The KV pool the server allocated (SGLang's `max_total_num_tokens`), in pages."""
    return requests.get(server.url + "/server_info", timeout=60).json()["max_total_num_tokens"] // page_size


def server_process(model: str, extra: list[str], flags: list[str], env: dict) -> ServerProcess:
    """One system's server as every eval run starts it (not started yet)."""
    # A short decode log interval keeps SGLang's used-token gauge fresh for the sampler.
    return ServerProcess(model, "--dtype", "float32", "--decode-log-interval", "4", *extra, *flags,
                         startup_timeout=600, env=env)


@contextmanager
def serve(model: str, extra: list[str], flags: list[str], env: dict, page_size: int, url: str | None = None):
    """One system's server as every eval run starts it, with the pool it allocated in pages; with `url`, the
    server running there instead (`--url`: none is started)."""
    with (served.Running(url) if url else server_process(model, extra, flags, env)) as server:
        yield server, pool_pages(server, page_size)


def pct(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))] if values else float("nan")


def kv_bytes_per_token(model_path: str) -> int:
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * cfg["num_hidden_layers"] * heads * head_dim * 4  # K and V, float32


def computed_tokens(meta: dict) -> int:
    """Prompt tokens a request computed: MEPIC's count, or what SGLang's prefix cache did not hold."""
    return meta.get("mepic_recomputed_tokens", meta["prompt_tokens"] - meta["cached_tokens"])


def ttft_parts(output) -> tuple[float, float, float] | None:
    """(before the queue, queue, prefill forward) seconds of one request, from SGLang's meta_info:
    before the queue is tokenizing and dispatch; the queue includes any hold for a chunk's storage read."""
    meta = output[2]
    if len(output) < 6 or not all(k in meta for k in ("queue_time", "forward_entry_time", "prefill_finished_time")):
        return None
    queue = meta["queue_time"]
    return (meta["forward_entry_time"] - queue - output[5], queue,
            meta["prefill_finished_time"] - meta["forward_entry_time"])


def summarize(points: list[Point], workloads: dict, new_tokens: int, page_bytes: int) -> list[dict]:
    """One row per point and seed; `workloads` maps (chunks, reuse, seed) to the requests sent."""
    ref = {(p.qps, p.chunks, p.reuse, p.seed): p for p in points if p.system == REFERENCE}
    rows = []
    for p in points:
        ids = [o[0] for o in p.outputs]
        metas = [o[2] for o in p.outputs]
        golds = [r.answers for r in workloads[(p.chunks, p.reuse, p.seed)]]
        base = ref.get((p.qps, p.chunks, p.reuse, p.seed))
        ref_ids = [o[0] for o in base.outputs] if base else None  # no reference ran: no fidelity figures
        peak = max(p.used_pages, default=0)
        if p.exact_peak is not None:
            peak = max(peak, p.exact_peak)
        recomputed = [computed_tokens(m) for m in metas]
        compiled = [m.get("mepic_compiled_tokens", 0) for m in metas]
        ttft = [o[3] for o in p.outputs]
        # A request that computed a chunk in its batch, and one whose chunks were all stored: their
        # TTFTs apart say what computing a chunk costs the request that first reads it.
        split = any(compiled) and not all(compiled)
        e2e = [o[4] for o in p.outputs]
        parts = [x for x in map(ttft_parts, p.outputs) if x is not None]
        rows.append({
            "system": p.system, "qps": p.qps, "chunks": p.chunks, "reuse": p.reuse, "seed": p.seed,
            "requests": len(ids), "pool_pages": p.pool_pages, "host_tier_gb": p.host_tier_gb,
            "peak_kv_pages": round(peak, 1),
            # The sampler polls at a fixed period, so a percentile of its samples is one over time.
            "p95_kv_pages": round(pct(p.used_pages, 0.95), 1) if p.used_pages else None,
            "mean_kv_pages": round(statistics.fmean(p.used_pages), 1) if p.used_pages else 0.0,
            "peak_occupied_pages": round(max(p.occupied_pages), 1) if p.occupied_pages else None,
            "capped": bool(p.pool_pages) and peak >= CAPPED_SHARE * p.pool_pages,
            "peak_kv_mib": round(peak * page_bytes / 2 ** 20, 2),
            "ttft_p50": pct(ttft, 0.5), "ttft_p99": pct(ttft, 0.99),
            "ttft_p50_stored": pct([t for t, c in zip(ttft, compiled) if not c], 0.5) if split else None,
            "ttft_p50_compiling": pct([t for t, c in zip(ttft, compiled) if c], 0.5) if split else None,
            "compiling_share": statistics.fmean(c > 0 for c in compiled) if any(compiled) else None,
            "tokenize_p50": pct([x[0] for x in parts], 0.5) if parts else None,
            "queue_p50": pct([x[1] for x in parts], 0.5) if parts else None,
            "forward_p50": pct([x[2] for x in parts], 0.5) if parts else None,
            "e2e_p50": pct(e2e, 0.5), "e2e_p99": pct(e2e, 0.99),
            **{k: p.counters.get(k) for k in COUNTERS},
            "throughput_rps": len(ids) / p.seconds if p.seconds else 0.0,
            "seconds": round(p.seconds, 2),
            "output_tok_s": sum(len(i) for i in ids) / p.seconds if p.seconds else 0.0,
            "prompt_tokens": statistics.fmean(m["prompt_tokens"] for m in metas),
            "recomputed_tokens": statistics.fmean(recomputed),
            # chunk tokens compile rows in the request's own batch computed: compute it caused
            "compiled_tokens": statistics.fmean(compiled) if any(compiled) else None,
            "f1": statistics.fmean(f1(o[1], g) for o, g in zip(p.outputs, golds)),
            "em": statistics.fmean(exact_match(o[1], g) for o, g in zip(p.outputs, golds)),
            "contains": statistics.fmean(contains(o[1], g) for o, g in zip(p.outputs, golds)),
            "agreement": statistics.fmean(prefix_agreement(a, b, new_tokens) for a, b in zip(ids, ref_ids))
            if ref_ids else None,
            "top1": statistics.fmean(top1_agreement(a, b) for a, b in zip(ids, ref_ids)) if ref_ids else None,
        })
    return rows


COLUMNS = [("system", "system", "{}"), ("qps", "QPS", "{:g}"), ("chunks", "chunks", "{}"),
           ("reuse_ratio", "reuse", "{:.2f}"), ("runs", "runs", "{}"),
           ("peak_kv_pages", "peak KV pages", "{:.0f}"), ("p95_kv_pages", "p95 KV pages", "{:.0f}"),
           ("mean_kv_pages", "mean KV pages", "{:.0f}"), ("peak_occupied_pages", "peak occupied pages", "{:.0f}"),
           ("capped", "capped", "{}"), ("peak_kv_mib", "peak KV MiB", "{:.1f}"),
           ("ttft_p50", "TTFT p50 s", "{:.2f}"), ("ttft_p99", "TTFT p99 s", "{:.2f}"),
           ("ttft_p50_stored", "TTFT p50 chunks stored s", "{:.2f}"),
           ("ttft_p50_compiling", "TTFT p50 compiling s", "{:.2f}"), ("compiling_share", "compiling", "{:.0%}"),
           ("tokenize_p50", "tokenize p50 s", "{:.3f}"), ("queue_p50", "queue p50 s", "{:.2f}"),
           ("forward_p50", "forward p50 s", "{:.3f}"),
           ("e2e_p50", "e2e p50 s", "{:.2f}"), ("e2e_p99", "e2e p99 s", "{:.2f}"),
           ("throughput_rps", "req/s", "{:.2f}"), ("recomputed_tokens", "recomputed tok/req", "{:.0f}"),
           ("compiled_tokens", "compiled tok/req", "{:.0f}"),
           ("prompt_tokens", "prompt tok/req", "{:.0f}"),
           ("chunks_compiled", "compiles", "{:.0f}"), ("chunk_evictions", "chunk evictions", "{:.0f}"),
           ("tier_loads_host", "host loads", "{:.0f}"), ("private_copy_fallbacks", "copy fallbacks", "{:.0f}"),
           ("f1", "F1", "{:.3f}"), ("em", "EM", "{:.3f}"), ("contains", "gold contained", "{:.3f}"),
           ("agreement", "agreement vs full", "{:.3f}"), ("top1", "top-1 vs full", "{:.3f}")]
POINT = ("system", "qps", "chunks", "reuse")


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (system, point) over its runs (seeds): the median of each figure, its range
    in `range`, and `capped` counting the runs whose peak reached the pool."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in POINT), []).append(r)
    out = []
    for runs in groups.values():
        row, spans = {k: runs[0][k] for k in POINT}, {}
        for k, value in runs[0].items():
            if k in POINT or k == "capped" or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            values = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
            if values:
                row[k] = statistics.median(values)
                spans[k] = (min(values), max(values))
        for k in runs[0]:
            row.setdefault(k, None)
        row.update(runs=len(runs), capped=sum(bool(r["capped"]) for r in runs), range=spans,
                   seed=[r["seed"] for r in runs])
        out.append(row)
    return out


def cell(row: dict, key: str, fmt: str) -> str:
    value = row.get(key)
    if key == "system":
        return value + (" †" if value in EMULATED else "")
    if key == "capped":
        return f"{value} of {row['runs']}" if value else "no"
    if value is None:
        return "—"
    text = fmt.format(value)
    low, high = row.get("range", {}).get(key, (value, value))
    if row.get("runs", 1) > 1 and key not in ("qps", "chunks", "reuse_ratio", "runs") and \
            fmt.format(low) != fmt.format(high):
        text += f" ({fmt.format(low)}–{fmt.format(high)})"
    return text


def table(rows: list[dict]) -> str:
    """Markdown, one line per aggregated row: the median and, over several runs, the range."""
    lines = ["| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in sorted(rows, key=lambda r: (r["reuse"] if r["reuse"] is not None else -1, r["chunks"], r["qps"],
                                         list(SYSTEMS).index(r["system"]))):
        lines.append("| " + " | ".join(cell(r, k, fmt) for k, _, fmt in COLUMNS) + " |")
    notes = [f"† {s}: {why}." for s, why in EMULATED.items() if any(r["system"] == s for r in rows)]
    if any(r["capped"] for r in rows):
        notes.append(f"capped: runs whose peak reached {CAPPED_SHARE:.0%} of the pool; the pool, not the "
                     "system, set their peak, and no ratio uses them.")
    return "\n".join(lines + ([""] + notes if notes else []))


# The ratios a reader takes from the tables: (figure, system, over system).
RATIOS = [("peak_kv_pages", "mepic", "epic-16"), ("peak_kv_pages", "mepic", "cacheblend-0.15"),
          ("peak_kv_pages", "mepic", "full"), ("ttft_p50", "mepic", "vanilla"), ("ttft_p50", "mepic", "epic-16")]


def ratios(rows: list[dict]) -> list[dict]:
    """Per point, each ratio of RATIOS over the runs where both systems ran with the same seed:
    median and range, and how many runs were left out because a peak was capped by the pool."""
    by = {(r["system"], r["qps"], r["chunks"], r["reuse"], r["seed"]): r for r in rows}
    out = []
    for q, c, reuse in dict.fromkeys((r["qps"], r["chunks"], r["reuse"]) for r in rows):
        for metric, a, b in RATIOS:
            values, capped = [], 0
            for seed in sorted({r["seed"] for r in rows}):
                x, y = by.get((a, q, c, reuse, seed)), by.get((b, q, c, reuse, seed))
                if x is None or y is None or not y[metric]:
                    continue
                if metric.startswith("peak") and (x["capped"] or y["capped"]):
                    capped += 1
                    continue
                values.append(x[metric] / y[metric])
            if values or capped:
                out.append({"qps": q, "chunks": c, "reuse": reuse, "metric": metric, "system": a, "over": b,
                            "median": statistics.median(values) if values else None,
                            "low": min(values, default=None), "high": max(values, default=None),
                            "runs": len(values), "capped_runs": capped})
    return out


def ratio_table(rows: list[dict]) -> str:
    lines = ["| QPS | chunks | reuse | ratio | median | range | runs | left out (capped) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"{'peak KV' if r['metric'].startswith('peak') else 'TTFT p50'} {r['system']} / {r['over']}"
        med = "—" if r["median"] is None else f"{r['median']:.2f}"
        span = "—" if r["low"] is None else f"{r['low']:.2f}–{r['high']:.2f}"
        reuse = "—" if r["reuse"] is None else f"{r['reuse']:g}"
        lines.append(f"| {r['qps']:g} | {r['chunks']} | {reuse} | {name} | {med} | {span} | {r['runs']} | "
                     f"{r['capped_runs']} |")
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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"{QUICK['requests']} requests at QPS {QUICK['qps']} "
                                                          f"and {QUICK['chunks']} chunks per request")
    ap.add_argument("--paper", action="store_true",
                    help=f"the paper's sweeps: {PAPER['requests']} requests per point around {PAPER['base']}, "
                         f"QPS {PAPER['qps']}, chunks {PAPER['chunks']}, reuse {PAPER['reuse']}; the 4-layer tiny "
                         f"model and a pool of {PAPER_POOL_PAGES:,} pages")
    ap.add_argument("--sweeps", default=",".join(SWEEPS),
                    help="with --paper: which of qps,chunks,reuse to sweep ('base': the base point alone)")
    ap.add_argument("--dataset", choices=sorted(DATASETS), default="squad")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--qps", default=None, help="comma-separated arrival rates (requests/s)")
    ap.add_argument("--chunks", default=None, help="comma-separated chunks per request (2-16)")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--reuse", type=float, default=None,
                    help="share of chunks that repeat an earlier one, 0-0.95 (eval.lib.workloads.with_reuse); "
                         "default: the dataset's own draw")
    ap.add_argument("--seed", type=int, default=0, help="the first run's seed (workload draw and arrivals)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of every point, with seeds --seed, --seed+1, ...; tables show the median and "
                         "the range over them")
    ap.add_argument("--host-tier-gb", type=float, default=DEFAULT_HOST_TIER_GB,
                    help=f"host memory for evicted chunk KV, the same for every position-independent system "
                         f"({', '.join(PIC)}), as LMCache's CPU tier is in the paper's stack; 0: none. "
                         f"Default {DEFAULT_HOST_TIER_GB:g}")
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct; "
                                                  "with --paper the 4-layer tiny random Llama)")
    ap.add_argument("--pool-pages", type=int, default=None,
                    help=f"KV pool size in pages of {MEPIC_PAGE_SIZE} tokens for every server (default: the "
                         f"launcher's CPU default, {DEFAULT_POOL_PAGES:,} pages; with --paper {PAPER_POOL_PAGES:,}); "
                         "a run whose peak reaches the pool is marked capped and left out of the ratios")
    ap.add_argument("--out", type=Path, default=None,
                    help="the run's folder (default: the scratch folder eval/results/local/<dataset>-<kind>, "
                         "git-ignored; a run to commit names its own under eval/results)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--resume", action="store_true",
                    help="keep the points a stopped run with the same settings saved in --out (points.jsonl, and "
                         "points.jsonl.xz if the folder holds a finished run) "
                         "and run only the rest (more --repeats add runs to the kept ones)")
    served.add_url(ap)
    ap.add_argument("--tables-only", action="store_true",
                    help="write table.md and results.json from the runs kept in --out (as --resume) and run "
                         "nothing: a system may then have fewer runs than --repeats (the header and each row say "
                         "how many); for a long run stopped partway")
    return ap


@dataclass
class RunPlan:
    """What a run is asked for, checked: its points, seeds, requests a point, systems, output folder, pool."""
    kind: str  # paper, quick or full
    points: list
    seeds: list[int]
    requests: int
    systems: list[str]
    out: Path
    pool_pages: int | None


def plan(args) -> RunPlan:
    """The run's points, seeds and systems from its arguments; a bad argument exits with status 2's message."""
    if args.paper and (args.quick or args.qps or args.chunks or args.reuse is not None):
        sys.exit("bad arguments: --paper sets QPS, chunks and reuse itself (choose sweeps with --sweeps)")
    if args.pool_pages is not None and args.pool_pages < 64:
        sys.exit(f"bad arguments: --pool-pages {args.pool_pages} (at least 64)")
    if args.repeats < 1 or args.host_tier_gb < 0:
        sys.exit(f"bad arguments: --repeats {args.repeats} (at least 1), --host-tier-gb {args.host_tier_gb:g} (>= 0)")
    if args.paper and not set(args.sweeps.split(",")) <= {*SWEEPS, "base"}:
        sys.exit(f"bad arguments: --sweeps {args.sweeps} (from {', '.join(SWEEPS)}, or base)")
    preset = PAPER if args.paper else QUICK if args.quick else FULL
    points = grid(args, preset)
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not all(2 <= c <= 16 for _, c, _ in points) or not all(q > 0 for q, _, _ in points):
        sys.exit(f"bad arguments: systems {unknown or 'ok'}, chunks {sorted({c for _, c, _ in points})} (2-16), "
                 f"qps {sorted({q for q, _, _ in points})} (> 0)")
    kind = "paper" if args.paper else "quick" if args.quick else "full"
    return RunPlan(kind, points, list(range(args.seed, args.seed + args.repeats)), args.requests or preset["requests"],
                   systems, out_dir(args.out, f"{args.dataset}-{kind}"),
                   args.pool_pages or (PAPER_POOL_PAGES if args.paper else None))


@dataclass
class Workload:
    """Each (chunks, reuse, seed) shape's requests, rendered prompts, their token counts and realised reuse."""
    model: str
    requests: dict
    texts: dict
    prompt_tokens: dict
    ratios: dict
    lengths: dict


def workload_of(args, p: RunPlan) -> Workload:
    """The requests of every point and seed, rendered with the model's tokenizer; the points the dataset cannot
    supply (a --paper sweep's) are dropped from `p.points`."""
    from transformers import AutoTokenizer

    # Absolute: the server starts in a directory of its own.
    model = (str(Path(args.model).resolve()) if args.model
             else str(models.build(models.EVAL_MODEL if args.paper else models.DEFAULT_MODEL)))
    tokenizer = AutoTokenizer.from_pretrained(model)
    n, requests_of = p.requests, {}
    for c, r in dict.fromkeys((c, r) for _, c, r in p.points):
        for seed in p.seeds:
            try:
                requests_of[(c, r, seed)] = (with_reuse(args.dataset, n, c, r, seed=seed) if r is not None
                                             else DATASETS[args.dataset](n, c, seed=seed))
            except ValueError as e:
                if not args.paper:
                    sys.exit(f"bad arguments: {e}")
                print(f"[workload] skipped: {e}")  # a sweep point the dataset cannot supply
    p.points = [pt for pt in p.points if all((pt[1], pt[2], seed) in requests_of for seed in p.seeds)]
    texts = {shape: [render(tokenizer, r) for r in reqs] for shape, reqs in requests_of.items()}
    prompt_tokens = {shape: [len(tokenizer.encode(t, add_special_tokens=False)) for t in ts]
                     for shape, ts in texts.items()}
    ratios_of, lengths = {}, {}
    for (c, r, seed), reqs in requests_of.items():
        ratios_of[(c, r, seed)] = reuse_ratio(reqs, lambda d: tokenizer.encode(d, add_special_tokens=False))
        lengths[(c, r, seed)] = statistics.fmean(prompt_tokens[(c, r, seed)])
        print(f"[workload] {args.dataset} seed {seed}: {n} requests x {c} chunks, reuse ratio "
              f"{ratios_of[(c, r, seed)]:.3f} (chunk tokens that repeat an earlier chunk), "
              f"mean prompt {lengths[(c, r, seed)]:.0f} tokens")
    return Workload(model, requests_of, texts, prompt_tokens, ratios_of, lengths)


def run_all(args, p: RunPlan, wl: Workload, checkpoint: Checkpoint, runs: list, done: dict) -> None:
    """Every (system, point, seed) run not in `done`, one server a system; each point saved as it ends."""
    page_size = MEPIC_PAGE_SIZE
    extra, env = context_args(wl.model, {(c, r): v for (c, r, _), v in wl.prompt_tokens.items()}, page_size,
                              args.new_tokens)
    if p.pool_pages:
        extra += ["--max-total-tokens", str(p.pool_pages * page_size)]
    last = time.perf_counter()
    with tqdm(total=len(runs) * p.requests, initial=len(done) * p.requests, desc="requests", unit="req") as bar:
        for system in p.systems:
            todo = [run for run in runs if run[0] == system and run not in done]
            if not todo:
                continue
            bar.set_postfix_str(f"{system}: starting server")
            flags, tier = tiered(system, SYSTEMS[system], args.host_tier_gb)
            with serve(wl.model, extra, flags, env, page_size, args.url) as (server, pool):
                for _, q, c, r, seed in todo:
                    bar.set_postfix_str(f"{system} qps={q:g} chunks={c}" + (f" reuse={r:g}" if r is not None else "")
                                        + f" seed={seed}")
                    outputs, sampler, exact, seconds, counters = run_point(
                        server, page_size, pool, wl.texts[(c, r, seed)], q, args.new_tokens, seed, bar)
                    point = Point(system, q, c, r, outputs, sampler.pages, exact, seconds,
                                  [], pool, time.perf_counter() - last,
                                  seed, sampler.occupied, counters, tier, anatomy.summarise(sampler.anatomy))
                    last = time.perf_counter()
                    checkpoint.add(asdict(point))
                    done[(system, q, c, r, seed)] = point


def report(args, argv, p: RunPlan, wl: Workload, checkpoint: Checkpoint, runs: list, done: dict) -> None:
    """table.md, results.json, the plots and the packed checkpoint in the run's folder, from the finished runs."""
    out, seeds, systems, n, points = p.out, p.seeds, p.systems, p.requests, p.points
    results = [done[run] for run in runs]
    minutes = sum(pt.wall for pt in results) / 60
    invocations = "" if checkpoint.invocations == 1 else f" over {checkpoint.invocations} invocations (--resume)"

    per_run = summarize(results, wl.requests, args.new_tokens, kv_bytes_per_token(wl.model) * MEPIC_PAGE_SIZE)
    for row in per_run:
        shape = (row["chunks"], row["reuse"], row["seed"])
        row["reuse_ratio"] = round(wl.ratios[shape], 4)
        row["mean_prompt_tokens"] = round(wl.lengths[shape], 1)
    rows = aggregate(per_run)
    ratio_rows = ratios(per_run)
    md = table(rows)
    pools = sorted({pt.pool_pages for pt in results})
    command = provenance.command("eval.experiments.run", argv if argv is not None else sys.argv[1:])
    shape = ", ".join(f"{statistics.median(wl.ratios[(c, r, s)] for s in seeds):.3f} reused over "
                      f"{statistics.median(wl.lengths[(c, r, s)] for s in seeds):.0f} prompt tokens at {c} chunks"
                      + (f" (reuse {r:g} asked)" if r is not None else "")
                      for c, r in dict.fromkeys((c, r) for c, r, _ in wl.requests))
    repeats = f"{len(seeds)} runs per point (seeds {seeds[0]}-{seeds[-1]}; median and range)" if len(seeds) > 1 \
        else f"1 run per point (seed {seeds[0]})"
    kept = {s: sorted({run[-1] for run in runs if run[0] == s}) for s in systems}
    if any(k != seeds for k in kept.values()):  # --tables-only over a run stopped partway
        repeats = ("runs per point (median and range): " + ", ".join(
            f"{s} {len(k)} (seed{'s' if len(k) > 1 else ''} {', '.join(map(str, k))})" for s, k in kept.items() if k)
            + ", as kept when the run stopped")
    capped = sum(r["capped"] for r in per_run)
    header = (f"{args.dataset}, {n} requests per point, {repeats}, {args.new_tokens} new tokens, greedy, float32, "
              f"model {Path(wl.model).name}, a KV pool of {' / '.join(f'{size:,}' for size in pools)} pages, "
              f"a host tier of {args.host_tier_gb:g} GB for {', '.join(s for s in PIC if s in systems) or 'none'}; "
              f"fidelity against `{REFERENCE}`. Realised reuse ratio (chunk tokens "
              f"that repeat an earlier chunk, median over the runs): {shape}. "
              f"{capped} of {len(per_run)} runs capped by the pool. {len(runs) * n} requests in "
              f"{minutes:.0f} min on this machine{invocations}."
              + (f" Every system ran on the server at {args.url} (--url), with its own flags." if args.url else "")
              + f"\n\nCommand: `{command}`\n\n")
    ratio_md = ratio_table(ratio_rows)
    (out / "table.md").write_text(header + md + "\n\n## Ratios\n\n" + ratio_md + "\n")
    (out / "results.json").write_text(json.dumps({
        "command": command, "kind": p.kind, "model": Path(wl.model).name, "dataset": args.dataset,
        "minutes": round(minutes, 1),
        "invocations": checkpoint.invocations, "seeds": seeds, "pool_pages": pools,
        "host_tier_gb": args.host_tier_gb, "rows": rows, "runs": per_run, "ratios": ratio_rows}, indent=2))
    if args.tables_only:  # read only: a run may still be appending to it
        if checkpoint.path.exists():
            print(f"[checkpoint] {checkpoint.path} left as it is; `python -m eval.lib.checkpoint pack {out}` packs it "
                  "for committing")
    elif packed := checkpoint.pack():
        print(f"[checkpoint] the points are packed into {packed} (committed; --resume reads it)")
    print(md)
    print(ratio_md)
    print(f"[time] {len(runs) * n} requests in {minutes:.1f} min{invocations}")
    if capped:
        print(f"[pool] {capped} of {len(per_run)} runs reached {CAPPED_SHARE:.0%} of the pool: marked capped, "
              "left out of the ratios (a larger --pool-pages measures them)")
    if not args.no_plots:
        if args.paper:
            base = PAPER["base"]
            charts = [(x, {k: v for k, v in base.items() if k != x}) for x in args.sweeps.split(",") if x in SWEEPS]
            metrics = ["peak_kv_pages", "ttft_p50", "ttft_p99"]
        else:
            qs, cs = sorted({q for q, _, _ in points}), sorted({c for _, c, _ in points})
            charts = [("qps", {"chunks": cs[-1]}), ("chunks", {"qps": qs[0]})]
            metrics = ["peak_kv_pages", "ttft_p50"]
        for path in plots(rows, out, charts, metrics):
            print(f"[plot] {path}")
    print(f"[results] {out}/table.md, {out}/results.json")


def resume(args, p: RunPlan, wl: Workload) -> tuple[Checkpoint, list, dict]:
    """The run's checkpoint (refused under other settings; --tables-only reads it and writes nothing), every
    (system, point, seed) run of the plan, and the finished ones it keeps; --tables-only keeps only those runs."""
    settings = {"dataset": args.dataset, "requests": p.requests, "new_tokens": args.new_tokens,
                "model": Path(wl.model).name, "pool_pages": p.pool_pages, "host_tier_gb": args.host_tier_gb}
    try:
        checkpoint = Checkpoint(p.out, settings, args.resume, read_only=args.tables_only)
    except ValueError as e:
        sys.exit(f"bad arguments: --resume: {e}")
    if checkpoint.set_aside:
        print(f"[checkpoint] an earlier run's points were moved to {checkpoint.set_aside} (--resume keeps them)")
    runs = [(s, *pt, seed) for s in p.systems for seed in p.seeds for pt in p.points]
    done = {run: Point.load(record) for run in runs if (record := checkpoint.get(*run))}
    if done:
        print(f"[resume] {len(done)} of {len(runs)} (system, point, seed) runs kept from {checkpoint.source}")
    if args.tables_only:
        runs = [run for run in runs if run in done]
        if not runs:
            sys.exit(f"bad arguments: --tables-only: {checkpoint.source} holds none of these runs")
    print(f"[checkpoint] each finished point goes to {checkpoint.path}; if this run stops, "
          "the same command with --resume goes on from there")
    return checkpoint, runs, done


def main(argv=None) -> None:
    """The steps of a run: its plan, its workload, the checkpoint it resumes, the runs, the report."""
    args = parser().parse_args(argv)
    args.resume = args.resume or args.tables_only  # --tables-only reads the points a run kept
    p = plan(args)
    p.out.mkdir(parents=True, exist_ok=True)
    wl = workload_of(args, p)
    checkpoint, runs, done = resume(args, p, wl)
    run_all(args, p, wl, checkpoint, runs, done)
    report(args, argv, p, wl, checkpoint, runs, done)


if __name__ == "__main__":
    main()
