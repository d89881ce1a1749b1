"""What the memory buys: the highest arrival rate each system serves within its SLO, per KV pool size.

    .venv/bin/python -m eval.experiments.capacity --quick                      # 2 pools, vanilla and mepic, 1 seed, short runs
    .venv/bin/python -m eval.experiments.capacity --out eval/results/capacity  # the full run (hours: run it alone)
    .venv/bin/python -m eval.experiments.capacity --pools 1024 --systems vanilla,epic-16,mepic --model models/smollm2-135m
    .venv/bin/python -m eval.experiments.capacity --resume --out DIR           # a stopped run goes on from its last cell
    .venv/bin/python -m eval.experiments.capacity --report --out DIR           # the tables and plot from the saved cells

Goodput, as serving benchmarks measure it (`vllm bench serve --goodput`): for each system and KV pool
size (pages of 16 tokens, `--max-total-tokens` of the server), the highest Poisson arrival rate at which
at least `--attainment` (0.95) of the requests meet both SLOs, TTFT <= `--ttft-slo` and e2e <=
`--e2e-slo`, and the queue does not grow over the run (the median queue wait of the last third of the
arrivals is within `--queue-slack` seconds of the first third's: a rate above capacity shows as a
queue that grows with time even where the SLOs still hold early on). The workload is eval.experiments.run's paper
workload (SQuAD, 7 chunks a request, reuse 0.85, 16 new tokens, greedy; `--dataset`, `--chunks` and
`--reuse` change it), the same requests for every system; each probe is a run of `--requests` (300) on a
flushed cache. Each server first serves `--warmup` (2) of the requests one at a time, then is flushed: a
fresh server's first forwards are slow, and in a probe they would be misses no rate caused. A probe ends
as soon as more requests have missed the SLO than the attainment allows (a request still in flight past
the e2e target counts as missed): the requests in flight are aborted, and the verdict is the one the
full run would have reached, without minutes spent draining a queue.

The rate is found by a bracket-then-bisect search on a log scale: from `--start-rate`, doubled while
it holds or halved while it fails, then bisected until the ratio between the lowest failing and the
highest holding rate is at most 1 + `--resolution` (0.15: capacities are good to 15%). A system that
fails at `--min-rate` has capacity 0. Each cell is run for every seed (workload draw and arrivals);
tables give the median and the range. A cell's search starts at the capacity its earlier seeds found, or
else the next smaller pool's, stepping by (1 + resolution)^2: two or three probes bracket it. Pools run
smallest first, one server at a time, so a run stopped part way has whole pools.

Default SLOs, for tiny-4l on this 2-core CPU: a lone request's TTFT is 0.3-0.45 s at the paper's base
point and its 16 tokens take about 1 s more; TTFT <= 2 s and e2e <= 8 s are about 5x that, the scale
of slack the goodput literature uses (DistServe, vLLM's --goodput examples); pass your own for another
model or machine. The header of the table states them.

Per cell, at the capacity point (the highest rate that held): peak and time-weighted KV pages, the
scheduler's busy time a request (SGLang's per-stage counters, idle left out, over the requests sent: on a CPU
what bounds the rate once the pool does not), and what
the server counted over that probe: retracted requests (SGLang's `num_retracted_requests_total`), chunk
evictions, and chunks compiled (a chunk computed more than once shows as more compiles than the
workload has distinct chunks), and what stopped it ("stopped by", read at the lowest rate that failed:
when SGLang's per-stage counters show the scheduler loop busy at least 90% of the probe, "forward" or
"scheduler", whichever took more of the busy seconds; else "pool" when the pool was within 5% of full or
requests were retracted; else "queue". Past capacity a full pool is a symptom as much as a cause).

Matched concurrency (`--matched 4,8,16` at the largest pool, each seed): N clients in a closed loop, each
sending its next request when its last one ends, keep N requests in flight, so each system runs at the
rate that N in flight gives it (Little's law: rate = N / mean e2e, both measured and reported); then
peak and time-weighted KV pages, and mepic's ratios to epic-16 and vanilla, seed by seed: the reading
comparable with the paper's Table 2. (Setting an open-loop Poisson rate to reach N in flight does not
converge: near capacity the number in flight jumps from a few to the whole run.)

KV dtypes (issue 73): `mepic-bf16` and `mepic-fp8` are mepic over a bf16 and an fp8 KV cache (fp8_e5m2 on
the CPU, where SGLang keeps e4m3 for its intel_amx backend only). With `--equal-bytes` each pool is read as
bytes, those of that many pages of a bf16 cache, and each system gets the pages they hold in its own KV dtype:
fp8 twice as many, the float32 cache of the CPU servers half (the table shows the pages each held). The ratio
mepic-fp8 / mepic-bf16 is then what halving the bytes of a page buys, seed by seed:

    .venv/bin/python -m eval.experiments.capacity --systems mepic-bf16,mepic-fp8 --pools 256 --equal-bytes --matched '' \
        --out eval/results/capacity-fp8

Pair it in time: one invocation runs every seed of the first system before the second's, and a ratio of two
capacities measured 10 minutes apart reads the machine's drift as well. On 2026-11-30 this 2-core VM's
scheduler took a fifth more busy time a request at the same rate half an hour later, and two such runs 15
minutes apart, of code that differed by 3% of busy time (measured A/B), gave 1.46 and 1.68. One invocation a
seed (`--seeds 0 --out D`, then `--seeds 1 --resume --out D`, ...) runs each seed's two cells back to back:

    for s in 0 1 2; do .venv/bin/python -m eval.experiments.capacity --systems mepic-bf16,mepic-fp8 --pools 192 \
        --equal-bytes --matched '' --requests 150 --seeds $s --resume --out eval/results/capacity-fp8-paired; done

Output (--out; without it the scratch folder eval/results/local/capacity, git-ignored, so that a --quick or trial
run never replaces the committed eval/results/capacity: a run to commit names its folder, eval/lib/outputs.py):
results.json (every probe), table.md (capacity table, matched table, the command, the machine's load before and
after, the wall time) and capacity.png (capacity against pool pages, a line per system, the range over seeds
shaded), anatomy.png (where the pages went over the capacity point's probe, one panel per system:
eval/lib/anatomy.py) and in_flight.png (the requests running and waiting over that probe). Every finished cell is appended to cells.jsonl as it ends (`--resume` keeps them).
"""

import argparse
import json
import math
import os
import platform
import re
import shlex
import signal
import statistics
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import requests
from tqdm import tqdm

from eval.experiments.run import (DEFAULT_HOST_TIER_GB, PAPER, SYSTEMS, Refused, abort_all, context_args, flush, pct,
                                  pool_pages, run_point, server_process, stream, tiered)
from eval.lib import anatomy, cpu_speed, provenance
from eval.lib.outputs import out_dir
from eval.lib.workloads import DATASETS, render, with_reuse
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE
from sglang_mepic.process.server_process import ServerError

DEFAULT_SYSTEMS = ("vanilla", "full", "epic-16", "cacheblend-0.15", "mepic")
# mepic over another KV cache dtype (issue 73): (system whose flags it takes, --kv-cache-dtype). On the CPU fp8 is
# e5m2 (SGLang keeps e4m3 there for its intel_amx backend only); the GPU run has e4m3 (eval/gpu/e2e/capacity.py).
KV_VARIANTS = {"mepic-bf16": ("mepic", "bf16"), "mepic-fp8": ("mepic", "fp8_e5m2")}
# Bytes of a KV element by --kv-cache-dtype; None: the model's dtype (`--dtype`, float32 on this CPU).
KV_BYTES = {"bf16": 2, "bfloat16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
MODEL_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_POOLS = (512, 1024, 2048, 4096)
QUICK = {"pools": (512, 1024), "systems": ("vanilla", "mepic"), "seeds": (0,), "requests": 12, "start_rate": 4.0,
         "min_rate": 2.0, "resolution": 1.0, "matched": (), "max_probes": 2, "warmup": 0}
NEW_TOKENS = 16
RETRACTED = "sglang:num_retracted_requests_total"
STAGES = "sglang:scheduler_stage_seconds_total"


@dataclass
class Probe:
    rate: float
    requests: int
    attainment: float  # share meeting both SLOs
    queue_first: float  # median queue wait of the first third of the arrivals, s
    queue_last: float  # and of the last third
    ok: bool
    ttft_p50: float
    e2e_p50: float
    e2e_mean: float
    achieved_rps: float
    in_flight: float  # mean requests in flight: sum of e2e / wall seconds (Little's law)
    peak_kv_pages: float
    mean_kv_pages: float
    counters: dict = field(default_factory=dict)
    seconds: float = 0.0
    ended_early: bool = False  # stopped once its misses exceeded what the attainment allows
    sent: int = 0  # requests sent (fewer than `requests` when it ended early)
    anatomy: dict = field(default_factory=dict)  # where the pages went (eval/lib/anatomy.py: peak, mean, series)
    refused: int = 0  # requests the server refused (run.Refused: more KV than it takes in one request), missed
    tpot_p50: float = 0.0  # time per output token after the first, s (median over the finished requests)
    queue_p50: float = 0.0  # the scheduler's queue wait, s (median over the finished requests)
    # The finished requests that missed the SLO, each {i (arrival order), sent_s (after the probe's start), queue,
    # ttft, tpot, e2e}: what a verdict was made of, so a miss can be read request by request (the requests a probe
    # ended early did not send or aborted count against attainment too, and are not listed).
    missed: list = field(default_factory=list)


@dataclass
class Cell:
    system: str
    pool_pages: int
    seed: int
    capacity: float  # req/s: the highest rate that held (0: none from --min-rate up)
    probes: list = field(default_factory=list)  # Probe as dicts, in the order run
    kind: str = "capacity"  # or "matched-<N>"
    seconds: float = 0.0  # wall time of the cell
    load: str = ""  # the machine's load average when the cell ended
    server_pages: int = 0  # pages the server's pool held (--equal-bytes: the pool's bytes in its KV dtype)


def finish_type(output) -> str | None:
    reason = output[2].get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else None


def refused(output) -> bool:
    return finish_type(output) == "refused"


def aborted(output) -> bool:
    """A request that did not finish: aborted, or refused by the server (`run.Refused`: a request larger than the
    pool takes is one the system cannot serve, a miss)."""
    return finish_type(output) in ("abort", "refused")


def tpot(output) -> float:
    """Seconds per output token after the first (vLLM's and SGLang's TPOT); 0 for a request of one token."""
    n = output[2].get("completion_tokens") or 0
    if n <= 1 or output[3] is None:
        return 0.0
    return (output[4] - output[3]) / (n - 1)


def meets(output, args) -> bool:
    """Whether a finished request met the SLO: TTFT, e2e, and with --tpot-slo the time per output token."""
    ttft = output[3] if output[3] is not None else math.inf
    if ttft > args.ttft_slo or output[4] > args.e2e_slo:
        return False
    tpot_slo = getattr(args, "tpot_slo", None)
    return tpot_slo is None or tpot(output) <= tpot_slo


def judge(outputs: list, rate: float, seconds: float, sampler, exact_peak, counters: dict, args,
          ended_early: bool = False) -> Probe:
    """One probe's figures from eval.experiments.run.run_point's outputs: (ids, text, meta, ttft, e2e, sent) per request,
    in the order of arrival; None for a request a probe that ended early did not send or aborted. Attainment is
    over all the requests of the probe (an unsent or aborted one has not met the SLO); the latencies are over the
    requests that finished."""
    done = [o for o in outputs if o is not None and not aborted(o)]
    ttft = [o[3] if o[3] is not None else math.inf for o in done]
    e2e = [o[4] for o in done]
    met = sum(meets(o, args) for o in done)
    queue = [o[2].get("queue_time") or 0.0 for o in done] or [0.0]
    third = max(1, len(queue) // 3)
    first, last = statistics.median(queue[:third]), statistics.median(queue[-third:])
    attainment = met / len(outputs)
    pages = sampler.pages
    peak = max(pages, default=0.0)
    if exact_peak is not None:
        peak = max(peak, exact_peak)
    ok = not ended_early and attainment >= args.attainment and last <= first + args.queue_slack
    return Probe(rate=rate, requests=len(outputs), attainment=round(attainment, 4), queue_first=round(first, 4),
                 queue_last=round(last, 4), ok=ok, ttft_p50=round(pct(ttft, 0.5), 4), e2e_p50=round(pct(e2e, 0.5), 4),
                 e2e_mean=round(statistics.fmean(e2e), 4) if e2e else math.nan,
                 achieved_rps=round(len(done) / seconds, 3), in_flight=round(sum(e2e) / seconds, 2),
                 peak_kv_pages=round(peak, 1), mean_kv_pages=round(statistics.fmean(pages), 1) if pages else 0.0,
                 counters=counters, seconds=round(seconds, 1), ended_early=ended_early,
                 sent=sum(o is not None for o in outputs), anatomy=anatomy.summarise(sampler.anatomy),
                 refused=sum(o is not None and refused(o) for o in outputs),
                 tpot_p50=round(pct([tpot(o) for o in done], 0.5), 5) if done else 0.0,
                 queue_p50=round(statistics.median(queue), 4), missed=missed_requests(outputs, args))


def missed_requests(outputs: list, args) -> list[dict]:
    """The finished requests of a probe that missed the SLO, with what each waited and took (see Probe.missed)."""
    sent = [o[5] for o in outputs if o is not None]
    start = min(sent, default=0.0)
    return [{"i": i, "sent_s": round(o[5] - start, 3), "queue": round(o[2].get("queue_time") or 0.0, 3),
             "ttft": round(o[3], 3) if o[3] is not None else None, "tpot": round(tpot(o), 4), "e2e": round(o[4], 3)}
            for i, o in enumerate(outputs) if o is not None and not aborted(o) and not meets(o, args)]


class Watch:
    """Ends a probe as soon as more of its requests have missed the SLO than the attainment allows: its verdict
    is then known, and a rate above capacity would otherwise spend minutes draining a queue. A request counts
    as missed when it finished outside the SLO, or when it is still in flight past the e2e target."""

    def __init__(self, url: str, requests_n: int, args):
        self.url, self.args = url, args
        self.allowed = math.floor((1 - args.attainment) * requests_n + 1e-9)
        self.stop, self._ended = threading.Event(), threading.Event()
        self._lock = threading.Lock()
        self._sent: dict[int, float] = {}
        self._missed = 0
        self.counters_at_stop: dict | None = None  # the scheduler's counters before the abort and its idle flush

    def sent(self, i: int) -> None:
        with self._lock:
            self._sent[i] = time.perf_counter()

    def done(self, i: int, output) -> None:
        with self._lock:
            self._sent.pop(i, None)
            if not meets(output, self.args):
                self._missed += 1
        self.check()

    def check(self) -> None:
        now = time.perf_counter()
        with self._lock:
            overdue = sum(now - t > self.args.e2e_slo for t in self._sent.values())
            first = self._missed + overdue > self.allowed and not self.stop.is_set()
            if first:  # under the lock: the watch thread and a finishing request may both see it
                self.stop.set()
        if first:
            self.counters_at_stop = scheduler_counters(self.url)
            abort_all(self.url)

    def _run(self) -> None:
        while not self._ended.wait(0.25):
            self.check()

    def __enter__(self):
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._ended.set()
        self._thread.join()


def scheduler_counters(url: str) -> dict:
    """SGLang's counters of the scheduler: requests retracted, and the seconds its loop spent in each stage
    (`run_batch` is the forward, `idle` waiting for work, the rest scheduling and result handling)."""
    return scheduler_counters_of(requests.get(url + "/metrics", timeout=30).text)


def scheduler_counters_of(metrics: str) -> dict:
    """scheduler_counters from a /metrics page already read."""
    out = {"retractions": 0.0, "stages": {}}
    for line in metrics.splitlines():
        if line.startswith(RETRACTED + "{"):
            out["retractions"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith(STAGES + "{") and (m := re.search(r'category="([a-z_]+)"', line)):
            out["stages"][m.group(1)] = out["stages"].get(m.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scheduler_delta(before: dict, after: dict) -> dict:
    stages = {k: round(v - before["stages"].get(k, 0.0), 3) for k, v in after["stages"].items()}
    return {"retractions": after["retractions"] - before["retractions"], "stage_seconds": stages}


def probe(server, pool: int, texts: list[str], rate: float, seed: int, args, bar, clients: int | None = None) -> Probe:
    """One run at `rate` (Poisson arrivals) that ends once it has failed: a capacity probe. With `clients`, a
    closed loop of that many clients instead, run to the end (matched concurrency: its rate is what it achieved)."""
    before = scheduler_counters(server.url)
    watch = None if clients else Watch(server.url, len(texts), args)
    with watch or ExitStack():
        outputs, sampler, exact, seconds, counters = run_point(server, MEPIC_PAGE_SIZE, pool, texts, rate, args.new_tokens,
                                                               seed, bar, watch=watch, clients=clients, refusals=True)
    after = scheduler_counters(server.url)
    if watch is not None and watch.counters_at_stop is not None:  # the stages up to the stop, not the flush after
        after = {**after, "stages": watch.counters_at_stop["stages"]}
    counters = {**counters, **scheduler_delta(before, after)}
    if clients:
        rate = round(len(outputs) / seconds, 3)
    return judge(outputs, rate, seconds, sampler, exact, counters, args, ended_early=bool(watch and watch.stop.is_set()))


def search(run, start: float, lo: float, hi: float, resolution: float, max_probes: int,
           step: float = 2.0) -> tuple[float, list]:
    """The highest rate in [lo, hi] at which run(rate).ok, by multiplying or dividing by `step` from `start` to a
    bracket, then bisecting on a log scale until failing / holding <= 1 + resolution. Returns (capacity, probes).
    A start taken from a neighbouring cell is close: a step of (1 + resolution)^2 brackets it in two probes."""
    probes, held, failed = [], None, None

    def attempt(rate):
        p = run(rate)
        probes.append(p)
        return p.ok

    rate = min(max(start, lo), hi)
    while len(probes) < max_probes:
        if attempt(rate):
            held = rate
            if failed is not None or rate >= hi:
                break
            rate = min(rate * step, hi)
        else:
            failed = rate
            if held is not None or rate <= lo:
                break
            rate = max(rate / step, lo)
    while held is not None and failed is not None and failed / held > 1 + resolution and len(probes) < max_probes:
        rate = math.sqrt(held * failed)
        if attempt(rate):
            held = rate
        else:
            failed = rate
    return (held or 0.0), probes


def spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def fmt(values: list[float], f: str = "{:.2f}") -> str:
    if not values:
        return "—"
    m, lo, hi = spread(values)
    return f.format(m) + ("" if lo == hi else f" ({f.format(lo)}–{f.format(hi)})")


def capacity_table(cells: list[Cell], systems: list[str], pools: list[int]) -> str:
    lines = ["| system | pool pages | capacity req/s | peak KV pages | time-weighted KV pages | retractions | "
             "chunk evictions | chunks compiled | TTFT p50 s | TPOT p50 ms | in flight | queue wait p50 s | "
             "copy fallbacks | scheduler busy ms a request | stopped by | probes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if any(c.server_pages and c.server_pages != c.pool_pages for c in cells):  # --equal-bytes
        lines[0] = lines[0].replace("| pool pages |", "| pool (bf16 pages' bytes): pages held |")
    for s in systems:
        for pool in pools:
            mine = [c for c in cells if c.system == s and c.pool_pages == pool and c.kind == "capacity"]
            if not mine:
                continue
            at = [best(c) for c in mine]
            at = [p for p in at if p is not None]
            held = sorted({c.server_pages for c in mine if c.server_pages and c.server_pages != pool})
            lines.append(f"| {s} | {pool:,}{''.join(f': {h:,}' for h in held)} | {fmt([c.capacity for c in mine])} | "
                         f"{fmt([p['peak_kv_pages'] for p in at], '{:.0f}')} | "
                         f"{fmt([p['mean_kv_pages'] for p in at], '{:.0f}')} | "
                         f"{fmt([p['counters'].get('retractions', 0) for p in at], '{:.0f}')} | "
                         f"{fmt([p['counters'].get('chunk_evictions') or 0 for p in at], '{:.0f}')} | "
                         f"{fmt([p['counters'].get('chunks_compiled') or 0 for p in at], '{:.0f}')} | "
                         f"{fmt([p['ttft_p50'] for p in at], '{:.3f}')} | "
                         f"{fmt([1000 * p.get('tpot_p50', 0.0) for p in at], '{:.1f}')} | "
                         f"{fmt([p['in_flight'] for p in at], '{:.1f}')} | "
                         f"{fmt([p.get('queue_p50', 0.0) for p in at], '{:.2f}')} | "
                         f"{fmt([p['counters'].get('private_copy_fallbacks') or 0 for p in at], '{:.0f}')} | "
                         f"{fmt([b for b in map(busy_ms_a_request, at) if b is not None], '{:.0f}')} | "
                         f"{', '.join(sorted({stopped_by(c) for c in mine}))} | {sum(len(c.probes) for c in mine)} |")
    refusals = [f"{c.system} at {c.pool_pages:,} pages, seed {c.seed}: {n}" for c in cells if c.kind == "capacity"
                and (n := max((p.get("refused", 0) for p in c.probes), default=0))]
    if refusals:
        lines += ["", "Requests the server refused (more KV than it takes in one request), each a miss in every "
                  "probe that sent it: " + "; ".join(refusals)]
    return "\n".join(lines)


def stopped_by(cell: Cell) -> str:
    """What ended the system's capacity in this cell, read from the lowest rate that failed. Past capacity the
    queue grows and SGLang admits what the pool holds, so a full pool there is as much a symptom as a cause;
    the scheduler's own per-stage counters decide first: when its loop was idle under 10% of the probe, the
    compute was saturated, and the forward (`run_batch`) or the scheduler (getting the next batch, which holds
    matching and MEPIC's planning, and handling results) is named by which took more of the busy time, with
    the forward's share. Otherwise the pool (within 5% of full, or requests retracted), else "queue". A probe
    run before the counters were recorded is judged on the pool alone."""
    failed = [p for p in cell.probes if not p["ok"] and p["rate"] > cell.capacity]
    if not failed:
        return "—"
    p = min(failed, key=lambda p: p["rate"])
    stages = p["counters"].get("stage_seconds") or {}
    total = sum(stages.values())
    busy = busy_seconds(stages)
    if total > 0 and busy >= 0.9 * total:
        forward = stages.get("run_batch", 0.0) / busy
        return f"{'forward' if forward >= 0.5 else 'scheduler'} ({forward:.0%} forward)"
    if p["peak_kv_pages"] >= 0.95 * cell.pool_pages or p["counters"].get("retractions", 0) > 0:
        return "pool"
    return "queue" if stages else "compute"


def busy_ms_a_request(probe: dict) -> float | None:
    """The scheduler's busy seconds over a probe (SGLang's per-stage counters, idle left out) per request sent,
    in ms: what a request costs the scheduler's process at that rate, the figure that bounds a CPU server's
    capacity and that an A/B of two codes at one rate compares (`--max-probes 1 --start-rate R`, one
    checkout's package first on PYTHONPATH). None for a probe without the counters."""
    stages = probe["counters"].get("stage_seconds") or {}
    sent = probe.get("sent") or probe.get("requests")
    if not stages or not sent:
        return None
    return 1000 * busy_seconds(stages) / sent


def busy_seconds(stages: dict) -> float:
    """The scheduler loop's seconds in every stage but `idle`."""
    return sum(stages.values()) - stages.get("idle", 0.0)


def best(cell: Cell) -> dict | None:
    """The probe at the capacity point: the highest rate that held."""
    held = [p for p in cell.probes if p["ok"]]
    return max(held, key=lambda p: p["rate"]) if held else None


def judged_pool(cells: list[Cell]) -> int | None:
    """The smallest pool where vanilla's median capacity is at least 1 req/s: where the capacity targets are read."""
    def cap(pool):
        values = [c.capacity for c in cells if (c.system, c.pool_pages, c.kind) == ("vanilla", pool, "capacity")]
        return statistics.median(values) if values else 0.0

    return next((p for p in sorted({c.pool_pages for c in cells if c.kind == "capacity"}) if cap(p) >= 1.0), None)


def paired(cells: list[Cell], kind: str, pool: int | None, a: str, b: str, value) -> list[float]:
    """value(a's cell) / value(b's cell) for each seed both ran (the same requests and arrivals)."""
    def by_seed(system):
        return {c.seed: c for c in cells if c.system == system and c.kind == kind
                and (pool is None or c.pool_pages == pool)}

    mine, theirs = by_seed(a), by_seed(b)
    return [value(mine[s]) / value(theirs[s]) for s in sorted(mine.keys() & theirs.keys()) if value(theirs[s]) > 0]


def capacity_of(cell: Cell) -> float:
    return cell.capacity


def last_probe(key: str):
    """A matched-concurrency cell's reading: its last run."""
    return lambda cell: cell.probes[-1][key] if cell.probes else 0.0


def matched_targets(cells: list[Cell]) -> list[int]:
    return sorted({int(c.kind.split("-")[1]) for c in cells if c.kind.startswith("matched-")})


# Issue 86's capacity targets, mepic over each baseline (the README's headline reads them at the memory-bound pool).
RATIO_TARGETS = {"epic-16": 2.0, "epic-16-host": 2.0, "vanilla": 1.5}
# ... and mepic over an fp8 cache at the baselines' pool bytes (--equal-bytes).
FP8_RATIO_TARGETS = {"epic-16": 3.5, "epic-16-host": 3.5}


def ratios(cells: list[Cell], pools: list[int]) -> list[str]:
    """mepic's capacity over each other system's, seed by seed, at the pool the targets are judged at."""
    pool, judged = judged_pool(cells), True
    pools_run = sorted({c.pool_pages for c in cells if c.kind == "capacity"})
    if pool is None:  # a slow model: the ratios still say what the memory buys, but no target is read
        if not pools_run:
            return ["no capacity cells"]
        pool, judged = pools_run[0], False
        why = "vanilla sustains under 1 req/s at every pool" if any(c.system == "vanilla" for c in cells) \
            else "no vanilla cells"
        out = [f"at {pool:,} pages, seed by seed ({why}: the capacity targets are not judged here):"]
    else:
        out = [f"at {pool:,} pages (the smallest pool where vanilla sustains >= 1 req/s), seed by seed:"]
    out += pool_ratios(cells, pool, judged)
    for other_pool in (p for p in pools_run if p != pool):  # what the ratio does with the pool (not judged)
        if more := pool_ratios(cells, other_pool, False):
            out += [f"at {other_pool:,} pages, seed by seed (not judged):", *more]
    for pool_ in pools_run:  # each pool: fp8 against bf16
        values = paired(cells, "capacity", pool_, "mepic-fp8", "mepic-bf16", capacity_of)
        if values:
            target = " (target >= 1.6: " + ("met)" if statistics.median(values) >= 1.6 else "missed)")
            out.append(f"- at {pool_:,} pages, capacity mepic-fp8 / mepic-bf16: {fmt(values)}{target}"
                       + without_ratio(cells, pool_, "mepic-fp8", "mepic-bf16"))
    return out


def pool_ratios(cells: list[Cell], pool: int, judged: bool) -> list[str]:
    """mepic's and mepic-fp8's capacity over each baseline at one pool, seed by seed, against issue 86's
    targets where `judged`."""
    out = []
    for mine, targets in (("mepic", RATIO_TARGETS), ("mepic-fp8", FP8_RATIO_TARGETS)):
        for other in ("epic-16", "epic-16-host", "vanilla", "cacheblend-0.15", "full"):
            values = paired(cells, "capacity", pool, mine, other, capacity_of)
            if values:
                m = statistics.median(values)
                target = f" (target >= {targets[other]}: " + ("met)" if m >= targets[other] else "missed)") \
                    if judged and other in targets else ""
                out.append(f"- capacity {mine} / {other}: {fmt(values)}{target}" + without_ratio(cells, pool, mine, other))
    return out


def without_ratio(cells: list[Cell], pool: int, a: str, b: str) -> str:
    """The seeds `paired` leaves out of a's ratio to b, said beside the ratio: a median over the other seeds must
    not pass for one over every seed. Left out: where b held no rate, and where only one of the two ran."""
    def seeds(system):
        return {c.seed: c for c in cells if (c.system, c.pool_pages, c.kind) == (system, pool, "capacity")}

    mine, theirs = seeds(a), seeds(b)
    why = {s: f"{b} held no rate there" for s in mine.keys() & theirs.keys() if theirs[s].capacity <= 0}
    why |= {s: f"{a if s in theirs else b} has no cell there" for s in mine.keys() ^ theirs.keys()}
    seeds_for = {reason: [s for s in sorted(why) if why[s] == reason] for reason in dict.fromkeys(why[s] for s in sorted(why))}
    return "".join(f"; seed{'s' if len(left) > 1 else ''} {', '.join(map(str, left))} left out: {reason}"
                   for reason, left in seeds_for.items())


def matched_table(cells: list[Cell], systems: list[str]) -> str:
    targets = matched_targets(cells)
    if not targets:
        return ""
    lines = ["| in flight (target) | system | rate req/s | in flight (measured) | peak KV pages | "
             "time-weighted KV pages | TTFT p50 s |", "|---|---|---|---|---|---|---|"]
    for n in targets:
        for s in systems:
            last = [c.probes[-1] for c in cells if c.system == s and c.kind == f"matched-{n}" and c.probes]
            if last:
                lines.append(f"| {n} | {s} | {fmt([p['rate'] for p in last])} | "
                             f"{fmt([p['in_flight'] for p in last], '{:.1f}')} | "
                             f"{fmt([p['peak_kv_pages'] for p in last], '{:.0f}')} | "
                             f"{fmt([p['mean_kv_pages'] for p in last], '{:.0f}')} | "
                             f"{fmt([p['ttft_p50'] for p in last], '{:.3f}')} |")
    lines += ["", "| in flight | ratio | peak | time-weighted | targets (8, 16 in flight) |", "|---|---|---|---|---|"]
    for n in targets:
        for other in ("epic-16", "vanilla"):
            peak = paired(cells, f"matched-{n}", None, "mepic", other, last_probe("peak_kv_pages"))
            mean = paired(cells, f"matched-{n}", None, "mepic", other, last_probe("mean_kv_pages"))
            if not peak:
                continue
            target = ""
            if other == "epic-16" and n in (8, 16):
                target = (f"peak ≤ 0.5: {'met' if statistics.median(peak) <= 0.5 else 'missed'}, time-weighted "
                          f"≤ 0.4: {'met' if mean and statistics.median(mean) <= 0.4 else 'missed'}")
            lines.append(f"| {n} | mepic / {other} | {fmt(peak)} | {fmt(mean)} | {target or '—'} |")
    return "\n".join(lines)


def plot(cells: list[Cell], systems: list[str], pools: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in systems:
        xs, med, lo, hi = [], [], [], []
        for pool in sorted(pools):
            values = [c.capacity for c in cells if (c.system, c.pool_pages, c.kind) == (s, pool, "capacity")]
            if values:
                m, a, b = spread(values)
                xs.append(pool), med.append(m), lo.append(a), hi.append(b)
        if xs:
            (line,) = ax.plot(xs, med, marker="o", label=s)
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"KV pool (pages of {MEPIC_PAGE_SIZE} tokens)")
    ax.set_ylabel("capacity (req/s within the SLO)")
    ax.set_title("Serving capacity at a fixed KV budget", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def at_capacity(cells: list[Cell], systems: list[str], pools: list[int]):
    """(system, pool, seed, the capacity point's anatomy) of each capacity cell that has one."""
    for s in systems:
        for pool in pools:
            for c in sorted((c for c in cells if (c.system, c.pool_pages, c.kind) == (s, pool, "capacity")),
                            key=lambda c: c.seed):
                if (p := best(c)) is not None and p.get("anatomy"):
                    yield s, pool, c.seed, p["anatomy"]


def matched_anatomy(cells: list[Cell], systems: list[str]):
    """(system, pool, seed, kind, anatomy) of each matched-concurrency cell that sampled one."""
    for s in systems:
        for c in sorted((c for c in cells if c.system == s and c.kind.startswith("matched")),
                        key=lambda c: (int(c.kind.split("-")[1]), c.seed)):
            if c.probes and c.probes[0].get("anatomy"):
                yield s, c.pool_pages, c.seed, c.kind, c.probes[0]["anatomy"]


def anatomy_section(cells: list[Cell], systems: list[str], pools: list[int]) -> str:
    rows = [(f"{s} (seed {seed})", pool, a) for s, pool, seed, a in at_capacity(cells, systems, pools)]
    parts = []
    if text := anatomy.table(rows):
        parts.append("Where the pages went at each cell's capacity point, at the sample with the most pages used "
                     "(eval/lib/anatomy.py; anatomy.png plots them over time):\n\n" + text)
    matched = [(f"{s}, {kind.split('-')[1]} in flight (seed {seed})", pool, a)
               for s, pool, seed, kind, a in matched_anatomy(cells, systems)]
    if text := anatomy.table(matched, "mean"):
        parts.append("Where the pages went with N requests in flight (matched concurrency), each category's mean "
                     "over the run; running requests are those admitted, holding KV rows:\n\n" + text)
    return "\n\n".join(parts)


def anatomy_panels(cells: list[Cell], systems: list[str], pools: list[int]) -> list[tuple[str, dict]]:
    """One panel per system: its capacity point at the smallest pool it has one, first seed; else its first
    matched-concurrency run."""
    panels, shown = [], set()
    for s, pool, seed, a in at_capacity(cells, systems, sorted(pools)):
        if s not in shown:
            shown.add(s)
            panels.append((f"{s}, {pool:,} pages, seed {seed}", a))
    for s, pool, seed, kind, a in matched_anatomy(cells, systems):
        if s not in shown:
            shown.add(s)
            panels.append((f"{s}, {pool:,} pages, {kind.split('-')[1]} in flight, seed {seed}", a))
    return panels


def loadavg() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def rendered(tokenizer, dataset: str, requests: int, chunks: int, reuse: float,
             seeds) -> dict[int, list[tuple[str, int]]]:
    """Each seed's prompts with their token counts: the requests of a capacity run, here or on the device
    (eval/gpu/e2e/workload.py renders them into its carry)."""
    texts = {seed: [render(tokenizer, r) for r in with_reuse(dataset, requests, chunks, reuse, seed=seed)]
             for seed in seeds}
    return {seed: [(t, len(tokenizer.encode(t, add_special_tokens=False))) for t in ts] for seed, ts in texts.items()}


def prompts(model: str, args, seeds: list[int]) -> dict[int, list[tuple[str, int]]]:
    """Each seed's prompts with their token counts, with the model's tokenizer."""
    from transformers import AutoTokenizer

    return rendered(AutoTokenizer.from_pretrained(model), args.dataset, args.requests, args.chunks, args.reuse, seeds)


def warm_start(cells: list[Cell], system: str, pool: int, args) -> tuple[float, float]:
    """Where a cell's search starts, and its step: at the median capacity of the seeds already run in the same
    cell, else at the capacity of the next smaller pool (a larger pool holds at least as much), with a step of
    (1 + resolution)^2; with neither, at --start-rate, doubling."""
    mine = [c.capacity for c in cells if (c.system, c.pool_pages, c.kind) == (system, pool, "capacity")]
    smaller = [c for c in cells if c.system == system and c.kind == "capacity" and c.pool_pages < pool]
    if not mine and smaller:
        nearest = max(c.pool_pages for c in smaller)
        mine = [c.capacity for c in smaller if c.pool_pages == nearest]
    held = statistics.median(mine) if mine else 0.0
    if held >= args.min_rate:
        return held, min(2.0, (1 + args.resolution) ** 2)
    return args.start_rate, 2.0


def load_cells(path: Path) -> list[Cell]:
    if not path.is_file():
        return []
    cells = []
    for line in path.read_text().splitlines():
        try:
            cells.append(Cell(**json.loads(line)))
        except (json.JSONDecodeError, TypeError):
            continue  # a line cut short by a stop
    return cells


class OutOfTime(Exception):
    """The run's --budget would end inside the next probe: stop before it (the finished cells are kept)."""


def run_cells(args, todo: list, cells: list[Cell], record, make_server, texts: dict[int, list[str]],
              deadline: float | None = None, server_start_s: float = 0.0) -> None:
    """Run the cells in `todo`, recording each as it ends; every server it starts is stopped.

    make_server(system, pool) -> ServerProcess (not launched): one system's server with a pool of that many
    pages; texts: each seed's prompts; deadline (time.time()): no probe starts that could end after it, and no
    server starts that could not be up `server_start_s` seconds before it."""
    with ExitStack() as stack:
        servers = {}

        def launch(system, pool):
            server = make_server(system, pool)
            server.launch()  # from this (the main) thread: a server dies with the thread that launched it
            server.launched_at = time.time()
            stack.callback(server.stop)
            servers[(system, pool)] = server
            return server

        def server_for(system, pool):
            if (system, pool) not in servers:
                if not args.together:  # one server at a time: the last one stops first
                    for key in list(servers):
                        servers.pop(key).stop()
                launch(system, pool)
            server = servers[(system, pool)]
            if not getattr(server, "pool_pages", None):
                server.wait_ready()
                server.pool_pages = pool_pages(server, MEPIC_PAGE_SIZE)
                print(f"[capacity] {system} pool {pool}: server ready within {time.time() - server.launched_at:.0f} s of "
                      f"its launch ({server.pool_pages} pages)", flush=True)
            return server, server.pool_pages

        def warm_up(server, texts_):
            """A fresh server's first forwards are slow (SmolLM2's first request took 24 s on a 2-core CPU):
            in a probe they are SLO misses no rate caused. A few requests, one at a time, then a flush."""
            if getattr(server, "warmed", False):
                return
            for text in texts_[:args.warmup]:
                try:
                    stream(server.url, text, args.new_tokens)
                except Refused:  # too large for this pool: it warms nothing, and the probes count it as a miss
                    pass
            flush(server.url)
            server.warmed = True

        def timed(server, pool, seed, bar):
            def run(rate):
                # A probe lasts its arrivals, then at most the e2e target for the last ones.
                if deadline is not None and time.time() + len(texts[seed]) / rate + args.e2e_slo > deadline:
                    raise OutOfTime(f"a probe at {rate:.2f} req/s would end past the budget")
                return probe(server, pool, texts[seed], rate, seed, args, bar)
            return run

        if args.together:  # launch them all at once: their imports overlap (a smoke run's time, not for timings)
            for key in dict.fromkeys((t[0], t[1]) for t in todo):
                launch(*key)
        bar = tqdm(desc="requests", unit="req", mininterval=5)
        for system, pool, seed, kind in todo:
            cell_started = time.time()
            if deadline is not None and (system, pool) not in servers and cell_started + server_start_s > deadline:
                raise OutOfTime(f"{system}'s server at {pool} pages (about {server_start_s:.0f} s to start) would "
                                "be up past the budget")
            server, got = server_for(system, pool)
            warm_up(server, texts[seed])
            bar.set_postfix_str(f"{system} pool {pool} seed {seed} {kind}")
            if kind == "capacity":
                start, step = warm_start(cells, system, pool, args)
                cap, probes = search(timed(server, got, seed, bar), start, args.min_rate, args.max_rate,
                                     args.resolution, args.max_probes, step)
            else:  # matched concurrency: n clients in a closed loop keep n requests in flight
                cap, probes = 0.0, [probe(server, got, texts[seed], 0.0, seed, args, bar, clients=int(kind.split("-")[1]))]
            record(Cell(system, pool, seed, round(cap, 3), [asdict(p) for p in probes], kind,
                        round(time.time() - cell_started, 1), loadavg(), server_pages=got))
            print(f"[capacity] {system} pool {pool} seed {seed} {kind}: "
                  + (f"{cap:.2f} req/s" if kind == "capacity" else f"{probes[-1].in_flight:.1f} in flight")
                  + f" after {len(probes)} probe(s)", flush=True)
        bar.close()


def system_flags(system: str, variants: dict = KV_VARIANTS) -> tuple[str, list[str]]:
    """(the system whose flags and host tier it takes, its own flags): a KV variant adds its dtype."""
    if system in variants:
        base, dtype = variants[system]
        return base, [*SYSTEMS[base], "--kv-cache-dtype", dtype]
    return system, list(SYSTEMS[system])


def pool_pages_for(system: str, pool: int, equal_bytes: bool, model_dtype: str = "float32",
                   variants: dict = KV_VARIANTS) -> int:
    """The pages a system's server gets for a pool: `pool` itself, or with --equal-bytes the pages that `pool`
    pages of a bf16 KV cache take in bytes hold in the system's own KV dtype (fp8 twice as many, float32 half)."""
    if not equal_bytes:
        return pool
    dtype = variants[system][1] if system in variants else None
    return pool * KV_BYTES["bf16"] // (KV_BYTES[dtype] if dtype else MODEL_BYTES[model_dtype])


def cpu_servers(model: str, args, prompt_tokens: list[int]):
    """make_server for run_cells on this machine: eval.experiments.run's servers (float32), each PIC system with the host
    tier, the model's context unless the prompts need more."""
    extra, env = context_args(model, {(args.chunks, args.reuse): prompt_tokens}, MEPIC_PAGE_SIZE, args.new_tokens)

    def make_server(system, pool):
        base, flags = system_flags(system)
        flags, _ = tiered(base, flags, args.host_tier_gb)
        pages = pool_pages_for(system, pool, args.equal_bytes)
        return server_process(model, [*extra, "--max-total-tokens", str(pages * MEPIC_PAGE_SIZE)], flags, env)
    return make_server


def parser(description: str = __doc__) -> argparse.ArgumentParser:
    """The arguments of a capacity run (eval/gpu/e2e/capacity.py adds the device's own to them)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"the smoke run: {QUICK}")
    ap.add_argument("--systems", default=None, help="comma-separated, default " + ",".join(DEFAULT_SYSTEMS))
    ap.add_argument("--pools", default=None, help="KV pool sizes in pages, default " + ",".join(map(str, DEFAULT_POOLS)))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--model", default="models/tiny-4l")
    ap.add_argument("--dataset", default="squad", choices=sorted(DATASETS))
    ap.add_argument("--chunks", type=int, default=PAPER["base"]["chunks"], help="documents a request")
    ap.add_argument("--reuse", type=float, default=PAPER["base"]["reuse"], help="share of documents drawn again")
    ap.add_argument("--requests", type=int, default=PAPER["requests"], help="requests per probe")
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens each request generates")
    ap.add_argument("--ttft-slo", type=float, default=2.0, help="seconds")
    ap.add_argument("--e2e-slo", type=float, default=None,
                    help="seconds (default 8; with --tpot-slo, TTFT SLO + TPOT SLO x (new tokens - 1))")
    ap.add_argument("--tpot-slo", type=float, default=None,
                    help="seconds per output token after the first (goodput as vLLM's --goodput tpot: judges it); "
                         "for decode-heavy requests, where e2e alone hides a slow decode behind a fast TTFT")
    ap.add_argument("--attainment", type=float, default=0.95, help="share of requests that must meet both SLOs")
    ap.add_argument("--warmup", type=int, default=2,
                    help="requests sent one at a time to each new server, then flushed, before its first probe")
    ap.add_argument("--queue-slack", type=float, default=0.5,
                    help="seconds the median queue wait of the last third may exceed the first third's")
    ap.add_argument("--start-rate", type=float, default=2.0)
    ap.add_argument("--min-rate", type=float, default=0.25)
    ap.add_argument("--max-rate", type=float, default=64.0)
    ap.add_argument("--resolution", type=float, default=0.15)
    ap.add_argument("--max-probes", type=int, default=9, help="per cell")
    ap.add_argument("--matched", default="4,8,16", help="in-flight targets at the largest pool ('' for none)")
    ap.add_argument("--host-tier-gb", type=float, default=DEFAULT_HOST_TIER_GB)
    ap.add_argument("--equal-bytes", action="store_true",
                    help="read each pool as bytes, those of that many pages of a bf16 KV cache: a system gets the "
                         "pages they hold in its own KV dtype (mepic-fp8 twice as many, a float32 one half)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the run's folder (default: the scratch folder eval/results/local/capacity, git-ignored; "
                         "a run to commit names its own, e.g. eval/results/capacity)")
    ap.add_argument("--resume", action="store_true", help="keep the cells a stopped run saved in --out")
    ap.add_argument("--report", action="store_true",
                    help="run nothing: write the table, results.json and plot from the cells saved in --out")
    ap.add_argument("--together", action="store_true",
                    help="start a system's servers for all pools at once (faster starts; idle servers stay up "
                         "while one is probed, so not for timings you report); --quick sets it")
    return ap


@dataclass
class Plan:
    """What a run is asked for, checked: its systems, pools, seeds, matched-concurrency targets."""
    systems: list[str]
    pools: list[int]
    seeds: list[int]
    targets: list[int]


def plan(args, variants: dict = KV_VARIANTS) -> Plan:
    """The run's systems, pools, seeds and targets from its arguments (--quick filled in); a bad one exits.
    variants: the KV-dtype systems the run may name beside eval.experiments.run's (KV_VARIANTS, or the device's)."""
    if getattr(args, "e2e_slo", None) is None:
        tpot_slo = getattr(args, "tpot_slo", None)
        args.e2e_slo = 8.0 if tpot_slo is None else round(args.ttft_slo + tpot_slo * max(args.new_tokens - 1, 0), 3)
    if not hasattr(args, "tpot_slo"):
        args.tpot_slo = None
    if args.quick:
        args.systems = args.systems or ",".join(QUICK["systems"])
        args.pools = args.pools or ",".join(map(str, QUICK["pools"]))
        args.seeds, args.requests, args.start_rate = "0", QUICK["requests"], QUICK["start_rate"]
        args.min_rate, args.resolution, args.max_probes = QUICK["min_rate"], QUICK["resolution"], QUICK["max_probes"]
        args.matched, args.together = ",".join(map(str, QUICK["matched"])), True
        args.warmup = QUICK["warmup"]  # a smoke run: its timings are not read
        if args.model == "models/tiny-4l" and not Path(args.model).is_dir():
            args.model = "models/tiny"
    got = Plan(systems=(args.systems or ",".join(DEFAULT_SYSTEMS)).split(","),
               pools=[int(p) for p in (args.pools or ",".join(map(str, DEFAULT_POOLS))).split(",")],
               seeds=[int(s) for s in args.seeds.split(",")],
               targets=[int(n) for n in args.matched.split(",") if n.strip()])
    bad = [s for s in got.systems if s not in SYSTEMS and s not in variants]
    if bad or min(got.pools) < 16 or not 0 < args.attainment <= 1 or args.min_rate <= 0 or args.max_rate < args.min_rate \
            or args.new_tokens < 1 or not args.ttft_slo > 0 or not (args.tpot_slo is None or args.tpot_slo > 0) \
            or not args.e2e_slo > 0:
        raise SystemExit(f"bad arguments: systems {bad or 'ok'} (from {', '.join([*SYSTEMS, *variants])}), "
                         f"pools {got.pools} "
                         f"(>= 16 pages), attainment {args.attainment} (0-1], rates {args.min_rate}-{args.max_rate}, "
                         f"new tokens {args.new_tokens} (>= 1), TTFT SLO {args.ttft_slo} s, TPOT SLO {args.tpot_slo} s "
                         f"and e2e SLO {args.e2e_slo} s (> 0)")
    return got


def run(args, argv: list[str], todo_of: Plan, model_name: str, prepare, deadline: float | None = None,
        note: str = "", module: str = "eval.experiments.capacity", machine: str | None = None,
        server_start_s: float = 0.0) -> list[Cell]:
    """Run what `todo_of` asks that --out does not hold yet (all of it without --resume), record the invocation,
    write the report; returns every cell. prepare(seeds) -> ({seed: prompts}, make_server), called only when a
    cell is to run (make_server as run_cells takes it); note: a line the invocation's record keeps; module: the
    command the record names; machine: where the servers ran (default: this machine's CPUs); server_start_s:
    what a server's start is counted as against the deadline."""
    args.out.mkdir(parents=True, exist_ok=True)
    saved, invocations = args.out / "cells.jsonl", args.out / "invocations.jsonl"
    args.resume = args.resume or args.report
    cells = load_cells(saved) if args.resume else []
    if not args.resume:
        saved.unlink(missing_ok=True)
        invocations.unlink(missing_ok=True)
    done = {(c.system, c.pool_pages, c.seed, c.kind) for c in cells}
    started, load_before, commit_at_start = time.time(), loadavg(), provenance.commit()
    # before any server of the run loads the machine; a --report run writes no invocation to record it in
    cpu_before = cpu_speed.probe_ms() if not args.report else None
    # Pool by pool, the smallest first (the capacity targets are judged at the smallest pool where vanilla holds
    # 1 req/s), so a run stopped part way has whole pools; one server at a time, each started once.
    p = todo_of
    todo = [(s, pool, seed, "capacity") for pool in sorted(p.pools) for s in p.systems for seed in p.seeds]
    todo += [(s, max(p.pools), seed, f"matched-{n}") for s in p.systems for n in p.targets for seed in p.seeds]
    todo = [t for t in todo if t not in done] if not args.report else []
    print(f"[capacity] {len(todo)} cells to run ({len(done)} kept); SLO TTFT <= {args.ttft_slo:g} s and e2e <= "
          f"{args.e2e_slo:g} s for {args.attainment:.0%}; {args.requests} requests a probe; load {load_before}",
          flush=True)

    def record(cell: Cell):
        cells.append(cell)
        with saved.open("a") as f:
            f.write(json.dumps(asdict(cell)) + "\n")

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, interrupted)  # a stopped run still records what it ran
    stopped, failed = "", None
    try:
        if todo:
            texts, make_server = prepare(sorted({t[2] for t in todo}))
            run_cells(args, todo, cells, record, make_server, texts, deadline, server_start_s)
    except KeyboardInterrupt:
        stopped = "stopped"
    except OutOfTime as e:
        stopped = f"out of time: {e}"
    except ServerError as e:  # its log's tail is in the message; the report of the cells before it is still written
        stopped, failed = "a server failed", e
    finally:
        signal.signal(signal.SIGTERM, before)
    if stopped:
        print(f"[capacity] {stopped}: the finished cells are kept (go on with --resume)", flush=True)
    settings = (f"Model {model_name}, {args.dataset}, {args.chunks} chunks, reuse "
                f"{args.reuse:g}, {args.requests} requests a probe, {args.new_tokens} new tokens, greedy; SLO: "
                f"TTFT <= {args.ttft_slo:g} s"
                f"{f', TPOT <= {args.tpot_slo * 1000:g} ms' if args.tpot_slo is not None else ''} and e2e <= "
                f"{args.e2e_slo:g} s for >= {args.attainment:.0%} of requests, "
                f"queue growth <= {args.queue_slack:g} s; {args.warmup} warm-up request(s) a server; rate resolution "
                f"{args.resolution:.0%}; a probe ends early once more requests missed the SLO than {args.attainment:.0%} allows")
    if not args.report:
        with invocations.open("a") as f:
            f.write(json.dumps({"argv": [provenance.portable(a) for a in argv],
                                "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)),
                                "wall_s": round(time.time() - started, 1), "load_before": load_before,
                                "load_after": loadavg(), "cpu_probe_ms": cpu_before,
                                "cells_run": len(cells) - len(done), "stopped": stopped or False,
                                "settings": settings, "module": module, "commit": commit_at_start,
                                "machine": machine or f"{os.cpu_count()}-core CPU",
                                **({"note": note} if note else {})}) + "\n")
    report(args, cells, p.systems, p.pools, settings)
    if failed is not None:
        raise failed
    return cells


def stop_reason(invocation: dict) -> str:
    """Why a recorded invocation stopped, where it said (an out-of-time stop does; Ctrl-C and older records not)."""
    stopped = invocation.get("stopped")
    return f": {stopped}" if isinstance(stopped, str) and stopped != "stopped" else ""


def report(args, cells: list[Cell], systems: list[str], pools: list[int], settings: str) -> None:
    """table.md, results.json, capacity.png, anatomy.png and in_flight.png in --out, from every cell and invocation there."""
    invocations = args.out / "invocations.jsonl"
    runs = [json.loads(line) for line in invocations.read_text().splitlines()] if invocations.is_file() else []
    systems = systems + [s for s in dict.fromkeys(c.system for c in cells) if s not in systems]
    pools = sorted({*pools, *(c.pool_pages for c in cells if c.kind == "capacity")})
    header = ["Commands (one line an invocation; a stopped run goes on with --resume):"]
    header += [f"- `python -m {provenance.module_now(r.get('module', 'eval.experiments.capacity'))} "
               f"{shlex.join(r['argv'])}`: {r['started']} UTC"
               + (f", commit {r['commit']}" if r.get("commit") else "") + ", "
               f"{r['cells_run']} cells in {r['wall_s'] / 60:.1f} min, load average {r['load_before']} before, "
               f"{r['load_after']} after" + (f", CPU probe {r['cpu_probe_ms']:g} ms" if r.get("cpu_probe_ms") else "")
               + (f" (stopped part way{stop_reason(r)})" if r.get("stopped") else "")
               + "".join(f"; {r[k]}" for k in ("withdrawn", "note") if r.get(k)) for r in runs]
    machines = ", ".join(dict.fromkeys(r["machine"] for r in runs if r.get("machine"))) \
        or f"{platform.node()}, {os.cpu_count()} CPUs"  # runs recorded before invocations named their machine
    header += [f"Machine: {machines}; {sum(c.seconds for c in cells) / 60:.1f} min over "
               f"the {len(cells)} cells", runs[-1].get("settings", settings) if runs else settings]
    text = "\n\n".join(["# Serving capacity at a fixed KV budget", "\n".join(header[:-2]), *header[-2:],
                        capacity_table(cells, systems, pools), "\n".join(ratios(cells, pools)),
                        matched_table(cells, systems), anatomy_section(cells, systems, pools)]) + "\n"
    (args.out / "table.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(
        {"invocations": runs, "args": {k: str(v) for k, v in vars(args).items()},
         "cells": [asdict(c) for c in cells]}, indent=1))
    plot(cells, systems, pools, args.out / "capacity.png")
    panels = anatomy_panels(cells, systems, pools)
    anatomy.plot(panels, args.out / "anatomy.png",
                 "Where the pages go: the capacity point (else a matched run), smallest pool, first seed")
    anatomy.plot_in_flight(panels, args.out / "in_flight.png",
                           "Requests in flight at the capacity point (else a matched run), smallest pool, first seed")
    print(text)
    print(f"[capacity] {args.out / 'table.md'}, results.json, capacity.png, anatomy.png, in_flight.png")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    args.out = out_dir(args.out, "capacity")
    todo_of = plan(args)
    model = str(Path(args.model).resolve())
    if not Path(model, "config.json").is_file():
        raise SystemExit(f"no model at {args.model}: build it with python -m sglang_mepic.models tiny-4l")

    def prepare(seeds):
        counted = prompts(model, args, seeds)
        texts = {seed: [t for t, _ in ts] for seed, ts in counted.items()}
        return texts, cpu_servers(model, args, [n for ts in counted.values() for _, n in ts])

    run(args, argv, todo_of, Path(model).name, prepare)


if __name__ == "__main__":
    main()
