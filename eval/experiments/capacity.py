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
else the next smaller pool's, stepping by (1 + resolution)^2: two or three probes bracket it (a start that was
not close strides out: the step is squared, up to 2, from the third probe, capacity_probe.search). Pools run
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

A probe and the search over rates are capacity_probe.py's; the tables, ratios and plots capacity_report.py's.
"""

import argparse
import json
import os
import signal
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from eval.experiments.capacity_probe import Cell, probe, search
from eval.experiments.capacity_report import report
from eval.experiments.run import (DEFAULT_HOST_TIER_GB, PAPER, SYSTEMS, Refused, context_args, flush, pool_pages,
                                  server_process, stream, tiered)
from eval.lib import cpu_speed, provenance
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
