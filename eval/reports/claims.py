"""The README's headline: one row per claim, the newest honest figure for it, where and on what it was measured.

Each claim names one committed results.json and reads one figure from it: the median and the range over its
seeds, paired seed by seed where it is a ratio. A claim whose run is not committed says "not run" and keeps its
target, so what is still unmeasured (the GPU rows) shows as plainly as what is measured. The runs a claim no
longer reads (superseded or withdrawn) are in docs/results.md with their history (`headline.all_figures`).
"""

import json
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eval.experiments import capacity, capacity_probe, capacity_report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "eval" / "results"
# Capacity where memory binds (issue 86): decode-heavy requests (256 new tokens) judged on TTFT and TPOT, EPIC's
# baseline charged its private copies (it waits for them, never reads the store's pages in place).
DECODE = RESULTS / "capacity-decode" / "results.json"  # 1,024 pages: where the 2-core forward binds mepic first
# Long prompts against EPIC with its chunks in host memory (2026-12-05); the pool-store epic-16 run
# (capacity-decode-long, 2.90) held each chunk twice and is kept in docs/results.md.
DECODE_LONG = RESULTS / "capacity-decode-long-host" / "results.json"
# 384 float32 pages (the bytes of 768 bf16 ones), vanilla, epic-16 and mepic on one day (2026-12-04): the pool at which
# memory, not the 2-core forward, decides what each system runs at once on a machine of that day's speed.
DECODE_384 = RESULTS / "capacity-decode-384" / "results.json"
# EPIC with its chunks in host memory at the same pool, beside mepic and mepic-fp8 at its bytes, all on machines of
# one speed (2026-12-06/07; the machines differ from day to day, eval/lib/cpu_speed.py, so ratios pair cells of one
# run only). The runs these rows read before are kept in docs/results.md: capacity-decode-384-host-b (2026-12-05, a
# machine twice as fast), and the pool-store epic-16's in-flight and fp8 rows (capacity-decode-384, -fp8-512).
DECODE_384_HOST = RESULTS / "capacity-decode-host-pools" / "results.json"
FP8 = RESULTS / "capacity-fp8-seeded" / "results.json"
SMOL_TTFT = RESULTS / "compile-rows" / "smol-squad-after" / "results.json"
SMOL_F1 = {"squad": RESULTS / "smollm2" / "squad" / "results.json",
           "hotpotqa": RESULTS / "smollm2" / "hotpotqa" / "results.json"}


def newest_gpu_capacity() -> Path:
    """The newest device run's capacity cells (eval/gpu/e2e, `run.sh capacity`, committed under a dated
    eval/results/gpu-e2e/<device>-<date>/ folder); the folder a first one would have when none is committed."""
    found = [p for p in sorted((RESULTS / "gpu-e2e").glob("*/**/results.json"))
             if '"cells"' in p.read_text()[:100_000]]
    return found[-1] if found else RESULTS / "gpu-e2e" / "capacity" / "results.json"


GPU_CAPACITY = newest_gpu_capacity()


@dataclass(frozen=True)
class Claim:
    name: str
    source: Path
    read: Callable[[dict], list[float]]  # the figure's values, one a seed, from the source's results
    target: str = "—"
    ok: Callable[[float], bool] | None = None
    fmt: str = "{:.2f}"


def _cells(results: dict, kind: str = "capacity") -> list[capacity_probe.Cell]:
    return [capacity_probe.Cell(**c) for c in results.get("cells", []) if c["kind"] == kind]


def bound_pool(results: dict) -> int | None:
    """The run's smallest pool: where the run was sized for memory to bind."""
    pools = sorted({c.pool_pages for c in _cells(results)})
    return pools[0] if pools else None


def capacity_ratio(a: str, b: str) -> Callable[[dict], list[float]]:
    def read(results):
        cells = _cells(results)
        return capacity_report.paired(cells, "capacity", bound_pool(results), a, b, capacity_report.capacity_of)
    return read


def in_flight_at_capacity(cell: capacity_probe.Cell) -> float:
    """Requests in flight at the cell's capacity point (Little's law)."""
    probe = capacity_report.best(cell)
    return probe["in_flight"] if probe else 0.0


def in_flight_ratio(a: str, b: str) -> Callable[[dict], list[float]]:
    """Requests in flight at each cell's capacity point, a over b seed by seed."""
    def read(results):
        return capacity_report.paired(_cells(results), "capacity", bound_pool(results), a, b, in_flight_at_capacity)
    return read


def fallbacks(results: dict) -> list[float]:
    """EPIC's requests that read stored pages in place, at each cell's capacity point (a baseline that shares)."""
    return [float((capacity_report.best(c) or {"counters": {}})["counters"].get("private_copy_fallbacks") or 0)
            for c in _cells(results) if c.system.startswith("epic")]


def run_ratio(metric: str, a: str, b: str) -> Callable[[dict], list[float]]:
    """An eval.experiments.run metric of a over b's, seed by seed (the same workload draw and arrivals)."""
    def read(results):
        by = {s: {r["seed"]: r[metric] for r in results.get("runs", []) if r["system"] == s and r.get(metric)}
              for s in (a, b)}
        return [by[a][seed] / by[b][seed] for seed in sorted(by[a].keys() & by[b].keys())]
    return read


def f1_gap(a: str, b: str) -> Callable[[dict], list[float]]:
    """F1 of a minus F1 of b, seed by seed."""
    def read(results):
        by = {s: {r["seed"]: r["f1"] for r in results.get("runs", []) if r["system"] == s and r.get("f1") is not None}
              for s in (a, b)}
        return [by[a][seed] - by[b][seed] for seed in sorted(by[a].keys() & by[b].keys())]
    return read


CLAIMS = [
    Claim("capacity within the SLO, mepic / EPIC with its chunks in host memory (epic-16-host, as on LMCache's CPU "
          "backend): SQuAD, 7 chunks, 256 new tokens, the memory-bound pool (384 float32 pages, the bytes of 768 "
          "bf16 pages)", DECODE_384_HOST, capacity_ratio("mepic", "epic-16-host"), "≥ 2.0", lambda v: v >= 2.0),
    Claim("capacity within the SLO, mepic / epic-16 with its chunk store in the KV pool (a request admitted holds "
          "its chunks twice): the memory-bound pool", DECODE_384,
          capacity_ratio("mepic", "epic-16"), "≥ 2.0", lambda v: v >= 2.0),
    Claim("capacity within the SLO, mepic / vanilla (SGLang's radix cache): the memory-bound pool", DECODE_384,
          capacity_ratio("mepic", "vanilla"), "≥ 1.5", lambda v: v >= 1.5),
    Claim("requests in flight at capacity, mepic / epic-16-host: the memory-bound pool", DECODE_384_HOST,
          in_flight_ratio("mepic", "epic-16-host"), "≥ 2", lambda v: v >= 2),
    Claim("epic-16 requests reading stored pages in place (its private copy skipped), per cell: the memory-bound pool",
          DECODE_384, fallbacks, "= 0", lambda v: v == 0, "{:.0f}"),
    Claim("capacity within the SLO, mepic / epic-16-host: long prompts (squad-long, 16 chunks, about 14k tokens), "
          "256 new tokens, 2,048 float32 pages", DECODE_LONG, capacity_ratio("mepic", "epic-16-host"), "≥ 3.0",
          lambda v: v >= 3.0),
    Claim("capacity within the SLO, mepic-fp8 / epic-16-host at equal pool bytes: SQuAD, 256 new tokens (1,536 fp8 "
          "pages against 384 float32 ones: 4x the pages here, 2x against bf16 on a GPU)", DECODE_384_HOST,
          capacity_ratio("mepic-fp8", "epic-16-host"), "≥ 3.5", lambda v: v >= 3.5),
    Claim("capacity within the SLO, mepic-fp8 / mepic-bf16 at equal pool bytes: SQuAD, 16 new tokens", FP8,
          capacity_ratio("mepic-fp8", "mepic-bf16"), "≥ 1.6", lambda v: v >= 1.6),
    Claim("TTFT p50, mepic / vanilla: SmolLM2-135M, SQuAD, 4 chunks, QPS 0.3", SMOL_TTFT,
          run_ratio("ttft_p50", "mepic", "vanilla"), "≤ 0.5", lambda v: v <= 0.5),
    Claim("F1, mepic − epic-16: SmolLM2-135M, SQuAD (accuracy no worse than the private-copy peer)", SMOL_F1["squad"],
          f1_gap("mepic", "epic-16"), "≥ −0.02", lambda v: v >= -0.02, "{:+.3f}"),
    Claim("F1, mepic − epic-16: SmolLM2-135M, HotpotQA", SMOL_F1["hotpotqa"], f1_gap("mepic", "epic-16"),
          "≥ −0.02", lambda v: v >= -0.02, "{:+.3f}"),
    Claim("capacity within the SLO, mepic / vanilla on a GPU (H100/H200, 8B-shaped model)", GPU_CAPACITY,
          capacity_ratio("mepic", "vanilla"), "≥ 2", lambda v: v >= 2),
]


def _argv_pools(argv: list[str]) -> set[int] | None:
    """The pools an eval.experiments.capacity invocation was asked for, read by the harness's own parser
    (`--pools=768`, an abbreviation), None where its argv names none or no longer parses."""
    try:
        pools = capacity.parser().parse_known_args(argv)[0].pools
    except SystemExit:
        return None
    return {int(p) for p in pools.split(",") if p.strip().isdigit()} if pools else None


def measured_on(path: Path, results: dict) -> str:
    """The machine and the commits a run names (the commit that committed its results where it names none),
    and its dates: the first and the last where its invocations span more than one (a run resumed later). Of a
    capacity run, only the invocations that ran the judged pool count: a later one at another pool measured
    none of the figures the row reads."""
    runs = results.get("invocations") if isinstance(results.get("invocations"), list) else []
    pool = bound_pool(results)
    if pool is not None:  # an invocation whose argv names no pools ran the default ones: it counts
        runs = [r for r in runs if pool in (_argv_pools(r.get("argv") or []) or {pool})] or runs
    last = runs[-1] if runs else {}
    machine = last.get("machine") or "2-core CPU"
    commits = list(dict.fromkeys(r["commit"] for r in runs if r.get("commit")))
    if not commits:
        out = subprocess.run(["git", "log", "-1", "--format=%h", "--", str(path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=10)
        commits = [f"committed in {out.stdout.strip()}" if out.returncode == 0 and out.stdout.strip() else "uncommitted"]
    days = sorted({r["started"][:10] for r in runs if r.get("started")})
    return (f"{machine}; {' to '.join(dict.fromkeys([commits[0], commits[-1]]))}"
            + (f"; {' to '.join(dict.fromkeys([days[0], days[-1]]))}" if days else ""))


def row(claim: Claim, load: Callable[[Path], dict | None]) -> str:
    results = load(claim.source)
    source = f"`{claim.source.relative_to(ROOT)}`"
    values = claim.read(results) if results is not None else []
    if not values:
        return f"| {claim.name} | not run | — | 0 | {claim.target} | — | {source} |"
    median = statistics.median(values)
    judged = claim.target if claim.ok is None else f"{claim.target}: {'met' if claim.ok(median) else 'missed'}"
    low, high = claim.fmt.format(min(values)), claim.fmt.format(max(values))
    return (f"| {claim.name} | {claim.fmt.format(median)} | {low}–{high} | {len(values)} | {judged} | "
            f"{measured_on(claim.source, results)} | {source} |")


def table(load: Callable[[Path], dict | None] | None = None) -> str:
    """The headline table; `load` reads a results.json (None: not run), `headline.load` by default."""
    if load is None:
        def load(path):
            return json.loads(path.read_text()) if path.is_file() else None
    return "\n".join(["| claim | median | range | seeds | target | measured on | source |",
                      "|---|---|---|---|---|---|---|", *(row(c, load) for c in CLAIMS)])
