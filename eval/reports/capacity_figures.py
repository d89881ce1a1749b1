"""The capacity runs' figures for docs/results.md's every-figure list (`headline.all_figures`): each run's
ratios at its pool, paired seed by seed, and fp8 against bf16 at equal bytes. A ratio over an epic-16 that read
stored pages in place says it is withdrawn."""

import itertools
import statistics
from pathlib import Path

from eval.experiments import capacity_probe, capacity_report
from eval.reports import claims

ROOT = claims.ROOT


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def span(values: list[float], fmt: str = "{:.2f}") -> tuple[str, str]:
    if not values:
        return "—", "—"
    return fmt.format(statistics.median(values)), f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def verdict(value: float | None, ok) -> str:
    return "not run" if value is None else ("met" if ok(value) else "missed")


def shared_note(cells: list[capacity_probe.Cell]) -> str:
    """' (withdrawn: ...)' where epic-16's cells read stored pages in place in any of their probes; '' otherwise."""
    epic = [c for c in cells if c.system == "epic-16"]
    shared = [c for c in epic if any((p.get("counters") or {}).get("private_copy_fallbacks") for p in c.probes)]
    if not shared:
        return ""
    return (f" (withdrawn: epic-16 read stored pages in place in {len(shared)} of its {len(epic)} cells, before its "
            "private copy was charged at admission)")


def run_of(results: dict) -> str:
    """What a capacity run served and where: model, workload, and the machine its invocations name (runs
    recorded before invocations named one ran on the 2-core CPU)."""
    given = results.get("args", {})
    machine = next((r["machine"] for r in reversed(results.get("invocations", [])) if r.get("machine")), "2-core CPU")
    return (f"{Path(given.get('model', 'tiny-4l')).name}, {given.get('dataset', 'squad')}, "
            f"{given.get('chunks', 7)} chunks; {machine}")


def capacity_rows(results: dict | None, path: Path) -> list[str]:
    """Capacity ratios at the judged pool and KV ratios at matched concurrency, seed by seed; "not run" rows
    where the cells are missing."""
    cells = [capacity_probe.Cell(**c) for c in (results or {}).get("cells", [])]
    source = f"`{rel(path)}`"

    def row(name, values, target, ok):
        med, rng = span(values)
        judged = target if target == "—" else f"{target}: {verdict(statistics.median(values) if values else None, ok)}"
        return f"| {name} | {med} | {rng} | {len(values)} | {judged} | {source} |"

    pool = capacity_report.judged_pool(cells)
    where = f"{pool:,} pages" if pool else "the smallest pool where vanilla holds 1 req/s"
    what = run_of(results or {})
    withdrawn = shared_note(cells)
    lines = [row(f"capacity within the SLO, mepic / {other}, at {where} ({what})"
                 + (withdrawn if other == "epic-16" else ""),
                 capacity_report.paired(cells, "capacity", pool, "mepic", other, capacity_report.capacity_of) if pool else [],
                 "≥ 2", lambda v: v >= 2) for other in ("epic-16", "vanilla")]
    for n in (capacity_report.matched_targets(cells) or [8, 16]):
        kind = f"matched-{n}"
        for key, label, target, bound in (("peak_kv_pages", "peak", "≤ 0.5", 0.5),
                                          ("mean_kv_pages", "time-weighted", "≤ 0.4", 0.4)):
            values = capacity_report.paired(cells, kind, None, "mepic", "epic-16", capacity_report.last_probe(key))
            judged = n in (8, 16)
            lines.append(row(f"{label} KV mepic / epic-16 at {n} requests in flight (matched concurrency; {what})"
                             f"{shared_note([c for c in cells if c.kind == kind])}", values,
                             target if judged else "—", lambda v, b=bound: v <= b))
    return lines


def more_capacity_rows(path: Path, results: dict | None) -> list[str]:
    """Capacity ratios of a capacity run at each of its pools, seed by seed: figures beside the judged ones."""
    cells = [capacity_probe.Cell(**c) for c in (results or {}).get("cells", []) if c["kind"] == "capacity"]
    what, lines = run_of(results or {}), []
    for pool in sorted({c.pool_pages for c in cells}):
        # Every pair a headline row may read, so that a row the headline no longer reads keeps its figure here.
        for system, other in itertools.product(("mepic", "mepic-fp8"), ("epic-16", "epic-16-host", "vanilla")):
            values = capacity_report.paired(cells, "capacity", pool, system, other, capacity_report.capacity_of)
            if values:
                med, rng = span(values)
                note = shared_note([c for c in cells if c.pool_pages == pool]) if other == "epic-16" else ""
                bytes_ = " (mepic-fp8 at the pages' bytes)" if system == "mepic-fp8" else ""
                lines.append(f"| capacity within the SLO, {system} / {other}, at {pool:,} pages{bytes_} ({what}){note} | "
                             f"{med} | {rng} | {len(values)} | — | `{rel(path)}` |")
        for other in ("epic-16", "epic-16-host"):
            if values := capacity_report.paired(cells, "capacity", pool, "mepic", other, claims.in_flight_at_capacity):
                med, rng = span(values)
                lines.append(f"| requests in flight at capacity, mepic / {other}, at {pool:,} pages ({what}) | {med} | "
                             f"{rng} | {len(values)} | — | `{rel(path)}` |")
    return lines


def fp8_rows(path: Path, results: dict | None, order: str) -> list[str]:
    """Capacity mepic-fp8 / mepic-bf16 at each pool (read as bytes), seed by seed, against the issue's 1.6."""
    cells = [capacity_probe.Cell(**c) for c in (results or {}).get("cells", []) if c["kind"] == "capacity"]
    what, lines = run_of(results or {}), []
    for pool in sorted({c.pool_pages for c in cells}):
        values = capacity_report.paired(cells, "capacity", pool, "mepic-fp8", "mepic-bf16", capacity_report.capacity_of)
        if values:
            med, rng = span(values)
            lines.append(f"| capacity within the SLO, mepic-fp8 / mepic-bf16, at the bytes of {pool:,} bf16 pages "
                         f"({what}; {order}{capacity_report.ratio_notes(cells, pool, 'mepic-fp8', 'mepic-bf16')}) | "
                         f"{med} | {rng} | {len(values)} | ≥ 1.6: "
                         f"{verdict(statistics.median(values), lambda v: v >= 1.6)} | `{rel(path)}` |")
    return lines
