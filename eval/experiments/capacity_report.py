"""A capacity run's report: the capacity table, mepic's ratios to each baseline seed by seed, the matched-
concurrency table, where the pages went, and the plots (table.md, results.json, capacity.png, anatomy.png,
in_flight.png), all read from the cells saved (capacity_probe.Cell); eval.reports reads the same figures."""

import json
import os
import platform
import shlex
import statistics
from dataclasses import asdict
from pathlib import Path

from eval.experiments.capacity_probe import Cell
from eval.lib import anatomy, provenance
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE


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
        return "not reached: held at every rate probed (a lower bound)" if held_throughout(cell) else "—"
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


def held_throughout(cell: Cell) -> bool:
    """Whether the cell held at every rate it probed: its search ran out of probes (--max-probes) before a rate
    failed, so its capacity is a lower bound (a search started low, at an earlier seed's capacity, can)."""
    return cell.kind == "capacity" and bool(cell.probes) and all(p["ok"] for p in cell.probes)


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
                       + ratio_notes(cells, pool_, "mepic-fp8", "mepic-bf16"))
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
                out.append(f"- capacity {mine} / {other}: {fmt(values)}{target}" + ratio_notes(cells, pool, mine, other))
    return out


def capacity_by_seed(cells: list[Cell], pool: int, system: str) -> dict[int, Cell]:
    """The system's capacity cells at `pool`, by seed."""
    return {c.seed: c for c in cells if (c.system, c.pool_pages, c.kind) == (system, pool, "capacity")}


def seeds_named(seeds: list[int]) -> str:
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def ratio_notes(cells: list[Cell], pool: int, a: str, b: str) -> str:
    """What to read beside a's ratio to b: the seeds left out (without_ratio), and the seeds whose ratio is a
    bound, not a figure (where either cell held at every rate it probed)."""
    mine, theirs = capacity_by_seed(cells, pool, a), capacity_by_seed(cells, pool, b)
    both = sorted(mine.keys() & theirs.keys())
    upper = [s for s in both if held_throughout(theirs[s]) and not held_throughout(mine[s])]
    lower = [s for s in both if held_throughout(mine[s]) and not held_throughout(theirs[s])]
    unknown = [s for s in both if held_throughout(mine[s]) and held_throughout(theirs[s])]
    out = without_ratio(cells, pool, a, b)
    for left, who, bound in ((upper, b, "an upper bound"), (lower, a, "a lower bound"),
                             (unknown, "both", "neither a figure nor a bound")):
        if left:
            out += f"; {seeds_named(left)}: {who} held at every rate probed, so the ratio there is {bound}"
    return out


def without_ratio(cells: list[Cell], pool: int, a: str, b: str) -> str:
    """The seeds `paired` leaves out of a's ratio to b, said beside the ratio: a median over the other seeds must
    not pass for one over every seed. Left out: where b held no rate, and where only one of the two ran."""
    mine, theirs = capacity_by_seed(cells, pool, a), capacity_by_seed(cells, pool, b)
    why = {s: f"{b} held no rate there" for s in mine.keys() & theirs.keys() if theirs[s].capacity <= 0}
    why |= {s: f"{a if s in theirs else b} has no cell there" for s in mine.keys() ^ theirs.keys()}
    seeds_for = {reason: [s for s in sorted(why) if why[s] == reason] for reason in dict.fromkeys(why[s] for s in sorted(why))}
    return "".join(f"; {seeds_named(left)} left out: {reason}" for reason, left in seeds_for.items())


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
