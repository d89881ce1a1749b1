"""The README's headline table and the paper's Table 2, generated from committed results.

    .venv/bin/python -m eval.reports.headline           # print them
    .venv/bin/python -m eval.reports.headline --write   # and replace them in README.md and docs/results.md

The README's headline is one row per claim, its newest honest figure (eval/reports/claims.py); every
figure of every run it has read, superseded and withdrawn ones marked, goes to docs/results.md
(`all_figures`). A figure whose EPIC baseline read stored pages in place (`private_copy_fallbacks`,
before its private copy was charged at admission) is marked withdrawn there: it measured mepic against
a partial mepic.

Nothing is typed in by hand: every figure is read from a `results.json` that
`eval.experiments.run` wrote (its command is in the table beside it), as the median and the
range over that run's repeats. A source that has not been run yet shows as "not
run", and a target is judged only on figures that exist.

It reads only the committed folders it names below (under eval/results, never the scratch folder
eval/results/local that a run without --out writes to: eval/lib/outputs.py), and refuses, writing
nothing, a results.json that a --quick run wrote: a smoke run is not a headline figure. `--write`
writes only a file whose blocks changed, and says which ("unchanged" when none did).
"""

import argparse
import json
import re
import statistics
from pathlib import Path

from eval.lib import outputs, provenance
from eval.reports import claims
from eval.reports.capacity_figures import capacity_rows, fp8_rows, more_capacity_rows, rel, span, verdict

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "eval" / "results"
# The runs the headline reads: (label, results.json).
TINY_BASE = RESULTS / "squad-paper" / "base-repeats" / "results.json"
TINY_QPS = RESULTS / "squad-paper" / "qps-repeats" / "results.json"
SMOL = {"squad": RESULTS / "smollm2" / "squad" / "results.json",
        "hotpotqa": RESULTS / "smollm2" / "hotpotqa" / "results.json"}
# TTFT against SGLang's prefix cache, rerun on the compile-row path (issue 47): vanilla and mepic, 3 seeds.
# The six-system runs above (4.5 h each) predate it; their F1 and mepic / epic-16 rows stay as they are.
SMOL_TTFT = {"squad": RESULTS / "compile-rows" / "smol-squad-after" / "results.json",
             "hotpotqa": RESULTS / "compile-rows" / "smol-hotpot-after" / "results.json"}
# What the memory buys (issue 50): capacity within the SLO at a fixed pool, and KV at matched concurrency.
CAPACITY = RESULTS / "capacity" / "results.json"
# The same search on another dataset and on the default model, at one pool each (issue 50).
CAPACITY_MORE = {"capacity-decode-host-pools": RESULTS / "capacity-decode-host-pools" / "results.json",
                 "capacity-decode-384-host-b": RESULTS / "capacity-decode-384-host-b" / "results.json",
                 "capacity-decode-384-host": RESULTS / "capacity-decode-384-host" / "results.json",
                 "capacity-decode-384": RESULTS / "capacity-decode-384" / "results.json",
                 "capacity-decode-fp8-512": RESULTS / "capacity-decode-fp8-512" / "results.json",
                 "capacity-decode-512": RESULTS / "capacity-decode-512" / "results.json",
                 "capacity-decode-long-host": RESULTS / "capacity-decode-long-host" / "results.json",
                 "capacity-decode-long": RESULTS / "capacity-decode-long" / "results.json",
                 "capacity-decode-fp8": RESULTS / "capacity-decode-fp8" / "results.json",
                 "capacity-hotpotqa": RESULTS / "capacity-hotpotqa" / "results.json",
                 "capacity-smollm2": RESULTS / "capacity-smollm2" / "results.json"}
# fp8 KV (issue 73): mepic over an fp8 cache against a bf16 one, at equal pool bytes (eval.experiments.capacity --equal-bytes):
# the runs paired by seed in time (one invocation a seed, 2026-11-30), newest first, then the first run.
CAPACITY_FP8 = {RESULTS / "capacity-fp8-seeded" / "results.json":
                "each seed's two cells back to back; an extend's context found once a forward, its reads seeding "
                "the decode (e40d511)",
                RESULTS / "capacity-fp8-cputhreads" / "results.json":
                "each seed's two cells back to back; the CPU scheduler's threads by forward (f3bb035)",
                RESULTS / "capacity-fp8-threads" / "results.json":
                "each seed's two cells back to back; the CPU scheduler on one thread (254a434)",
                RESULTS / "capacity-fp8-batched" / "results.json":
                "each seed's two cells back to back; every core, decode reads batched (fb5f291)",
                RESULTS / "capacity-fp8-paired" / "results.json": "each seed's two cells back to back",
                RESULTS / "capacity-fp8-3chunks" / "results.json": "each seed's two cells back to back",
                RESULTS / "capacity-fp8" / "results.json": "every bf16 cell first"}
TABLE2 = {"squad": RESULTS / "squad-paper" / "base-repeats" / "results.json",
          "hotpotqa": RESULTS / "hotpotqa-paper" / "base-repeats" / "results.json"}
# The paper's Table 2 (Mistral-7B, vLLM + LMCache, Ascend 910B): SQuAD only of our datasets.
PAPER_TABLE2 = {"squad": {"mepic": (116.0, 27.7, 0.74), "cacheblend-0.15": (119.4, 54.5, 0.73),
                          "epic-16": (114.7, 54.1, 0.72)}}
BEGIN, END = "<!-- {name}:begin (eval.reports.headline writes this) -->", "<!-- {name}:end -->"


def sources() -> list[Path]:
    """Every results.json the headline and the tables read, each once."""
    return list(dict.fromkeys([TINY_BASE, TINY_QPS, *SMOL.values(), *SMOL_TTFT.values(), CAPACITY,
                               *CAPACITY_MORE.values(), *CAPACITY_FP8, *TABLE2.values(),
                               *(c.source for c in claims.CLAIMS)]))


def shared_runs_note(results: dict | None) -> str:
    """The same for an eval.experiments.run results.json: its epic-16 runs that read stored pages in place."""
    runs = [r for r in (results or {}).get("runs", []) if r["system"] == "epic-16"]
    shared = [r for r in runs if r.get("private_copy_fallbacks")]
    if not shared:
        return ""
    return (f" (withdrawn: epic-16 read stored pages in place in {len(shared)} of its {len(runs)} runs, before its "
            "private copy was charged at admission)")


def refuse_uncommitted_sources(paths) -> None:
    """Exit if a source is not a committed folder: outside eval/results, or in its scratch folder eval/results/local."""
    bad = [str(p) for p in paths if not p.is_relative_to(RESULTS) or outputs.is_scratch(p)]
    if bad:
        raise SystemExit("eval.reports.headline: a source must be a committed folder under eval/results, not the "
                         "scratch folder eval/results/local: " + ", ".join(bad))


def load(path: Path) -> dict | None:
    """A source's results, None if it has not been run; exits, writing nothing, if a --quick run wrote it."""
    if not path.is_file():
        return None
    results = json.loads(path.read_text())
    if why := outputs.quick_run(results):
        raise SystemExit(f"eval.reports.headline: {rel(path)} is a smoke run ({why}), not a committed result: "
                         f"nothing written. Restore the committed run (`git checkout -- {rel(path.parent)}`) or "
                         f"make a full one with --out {rel(path.parent)}; a --quick run without --out goes to "
                         f"{outputs.LOCAL}/.")
    return results


def ratio(results: dict | None, metric: str, system: str, over: str, qps: float | None = None) -> dict | None:
    """The ratio row of one run's results (at its only point, or at `qps`)."""
    if results is None:
        return None
    rows = [r for r in results["ratios"] if (r["metric"], r["system"], r["over"]) == (metric, system, over)
            and (qps is None or r["qps"] == qps)]
    return rows[0] if rows else None


def per_run(results: dict | None, system: str, key: str) -> list[float]:
    if results is None:
        return []
    return [r[key] for r in results["runs"] if r["system"] == system and r.get(key) is not None]


def runs_per_point(results: dict) -> str:
    """How many runs each point has: one count, or one per system where a stopped run's tables
    (eval.experiments.run --tables-only) kept fewer for some."""
    kept = {}
    for r in results["runs"]:
        kept.setdefault(r["system"], set()).add(r["seed"])
    counts = {system: len(seeds) for system, seeds in kept.items()}
    if len(set(counts.values())) <= 1:
        return f"{max(counts.values(), default=0)} run(s) per point"
    return "runs per point: " + ", ".join(f"{system} {n}" for system, n in counts.items())


def top_below_saturation(results: dict | None) -> float | None:
    """The highest QPS of a sweep at which no run of mepic or epic-16 was capped by the pool."""
    if results is None:
        return None
    capped = {r["qps"] for r in results["runs"] if r["system"] in ("mepic", "epic-16") and r["capped"]}
    fine = [q for q in {r["qps"] for r in results["runs"]} if q not in capped]
    return max(fine, default=None)


def headline() -> str:
    """The README's headline: one row per claim (claims.py); every run's figures are in `all_figures`."""
    return claims.table(load) + ("\n\nEach row reads one committed run; a ratio is paired seed by seed (the same "
                                 "requests and arrivals), median and range over the seeds. Every figure of every "
                                 "run, the superseded and withdrawn ones with them: [docs/results.md]"
                                 "(docs/results.md#every-figure).")


def all_figures() -> str:
    """Every figure of the runs the headline has read, newest claims first in the README (`headline`)."""
    base, qps = load(TINY_BASE), load(TINY_QPS)
    smol = {k: load(v) for k, v in SMOL.items()}
    smol_ttft = {k: load(v) for k, v in SMOL_TTFT.items()}
    cap = load(CAPACITY)
    lines = ["| figure | median | range | runs | target | source |", "|---|---|---|---|---|---|",
             *capacity_rows(cap, CAPACITY),
             *(row for p in (claims.DECODE, *CAPACITY_MORE.values()) for row in more_capacity_rows(p, load(p))),
             *(row for p, order in CAPACITY_FP8.items() for row in fp8_rows(p, load(p), order))]

    def add_ratio(name, results, path, metric, a, b, target, ok, q=None):
        r = ratio(results, metric, a, b, q)
        med = None if r is None or r["median"] is None else r["median"]
        cells = ("—", "—", "0") if med is None else (f"{med:.2f}", f"{r['low']:.2f}–{r['high']:.2f}", str(r["runs"]))
        left = f", {r['capped_runs']} capped left out" if r and r["capped_runs"] else ""
        judged = target if target == "—" else f"{target}: {verdict(med, ok)}"
        note = shared_runs_note(results) if "epic-16" in (a, b) else ""
        lines.append(f"| {name}{note} | {' | '.join(cells)}{left} | {judged} | `{rel(path)}` |")

    add_ratio("peak KV mepic / epic-16, SQuAD base point (tiny-4l)", base, TINY_BASE, "peak_kv_pages", "mepic",
              "epic-16", "≤ 0.5", lambda v: v <= 0.5)
    top = top_below_saturation(qps)
    add_ratio(f"peak KV mepic / epic-16, QPS {f'{top:g}' if top is not None else '?'} (top of the sweep below "
              "saturation)", qps, TINY_QPS, "peak_kv_pages", "mepic", "epic-16", "≤ 0.3", lambda v: v <= 0.3, top)
    add_ratio("peak KV mepic / cacheblend-0.15, SQuAD base point", base, TINY_BASE, "peak_kv_pages", "mepic",
              "cacheblend-0.15", "—", lambda v: True)
    add_ratio("peak KV mepic / full, SQuAD base point", base, TINY_BASE, "peak_kv_pages", "mepic", "full",
              "—", lambda v: True)
    for ds, results in smol.items():
        add_ratio(f"TTFT p50 mepic / vanilla, {ds} (SmolLM2, 30 requests at QPS 0.3)", smol_ttft[ds], SMOL_TTFT[ds], "ttft_p50", "mepic",
                  "vanilla", "≤ 0.5", lambda v: v <= 0.5)
        add_ratio(f"TTFT p50 mepic / epic-16, {ds} (SmolLM2, before compile rows)", results, SMOL[ds], "ttft_p50",
                  "mepic", "epic-16", "—", lambda v: True)
    for ds, results in smol.items():
        f1 = {s: per_run(results, s, "f1") for s in ("full", "naive", "epic-16", "cacheblend-0.15", "mepic",
                                                      "vanilla")}
        for s, values in f1.items():
            med, rng = span(values, "{:.3f}")
            target = ""
            if s == "mepic" and values:
                m = statistics.median(values)
                epic, naive = f1["epic-16"], f1["naive"]
                target = " / ".join(x for x in (
                    f"≥ epic-16 − 0.02: {verdict(m, lambda v: v >= statistics.median(epic) - 0.02)}" if epic else "",
                    f"≥ naive + 0.05: {verdict(m, lambda v: v >= statistics.median(naive) + 0.05)}" if naive else "")
                    if x)
            lines.append(f"| F1 {s}, {ds} (SmolLM2) | {med} | {rng} | {len(values)} | {target or '—'} | "
                         f"`{rel(SMOL[ds])}` |")
    sources = [(p, load(p)) for p in (TINY_BASE, TINY_QPS, *SMOL.values(), *SMOL_TTFT.values())]
    runs = (cap or {}).get("invocations", [])
    notes = [f"- `{rel(CAPACITY)}`: " + ("; ".join(f"`python -m eval.experiments.capacity {' '.join(r['argv'])}` "
                                                 f"({r['wall_s'] / 60:.0f} min"
                                                 + (", cells withdrawn: see its table" if r.get("withdrawn") else "")
                                                 + ")" for r in runs) or "not run yet")
             + ("; the fixed-QPS rows below it are the secondary figures" if runs else "")]
    notes += [f"- `{rel(p)}`: " + (f"`{provenance.current(r['command'])}`, model {r['model']}, {runs_per_point(r)}, "
                                   f"pool {' / '.join(f'{x:,}' for x in r.get('pool_pages', []))} pages, "
                                   f"{r['minutes']:.0f} min" if r else "not run yet")
             for p, r in sources]
    return "\n".join(lines + ["", "Sources:", *notes])


def table2() -> str:
    lines = ["| dataset | system | latency s (ours) | peak KV % of pool (ours) | F1 (ours, SmolLM2) | "
             "latency s (paper) | peak HBM % (paper) | F1 (paper) |", "|---|---|---|---|---|---|---|---|"]
    sources = []
    for ds, path in TABLE2.items():
        results, smol = load(path), load(SMOL[ds])
        sources.append((path, results))
        for system in ("mepic", "cacheblend-0.15", "epic-16"):
            latency, _ = span(per_run(results, system, "seconds"), "{:.1f}")
            share = [r["peak_kv_pages"] / r["pool_pages"] * 100 for r in (results or {}).get("runs", [])
                     if r["system"] == system and r["pool_pages"]]
            peak, _ = span(share, "{:.1f}")
            f1, _ = span(per_run(smol, system, "f1"), "{:.3f}")
            paper = PAPER_TABLE2.get(ds, {}).get(system)
            theirs = " | ".join(f"{x:g}" for x in paper) if paper else "— | — | —"
            lines.append(f"| {ds} | {system} | {latency} | {peak} | {f1} | {theirs} |")
    notes = [f"- `{rel(p)}`: " + (f"`{provenance.current(r['command'])}`, model {r['model']}, "
                                   f"{len(r.get('seeds', [0]))} run(s), "
                                   f"{r['minutes']:.0f} min" if r else "not run yet") for p, r in sources]
    return "\n".join(lines + ["", "Sources (F1 from the SmolLM2 runs of the headline):", *notes])


def capacity_tables(results: Path = CAPACITY) -> str:
    """eval.experiments.capacity's table.md as it wrote it, below its title."""
    table = results.with_name("table.md")
    load(results)  # a smoke run's table is refused with its results.json
    if not table.is_file():
        return f"Not run yet: `python -m eval.experiments.capacity --out {rel(results.parent)}`."
    return table.read_text().split("\n", 1)[1].strip() + f"\n\nFrom `{rel(table)}`; the plot is `{rel(results.with_name('capacity.png'))}`."


def replace(path: Path, text: str, name: str, body: str) -> str:
    """`text` (the file at `path`) with its block `name` replaced by `body`."""
    begin, end = BEGIN.format(name=name), END.format(name=name)
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{rel(path)} has no {begin} ... {end} block to replace")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def write(blocks) -> str:
    """Replace the blocks in their files, writing only a file whose text changed; a line saying which did."""
    texts = {path: path.read_text() for path, _, _ in blocks}
    new = dict(texts)
    for path, name, body in blocks:
        new[path] = replace(path, new[path], name, body)
    changed = [path for path in texts if new[path] != texts[path]]
    for path in changed:
        path.write_text(new[path])
    same = [rel(p) for p in texts if p not in changed]
    if not changed:
        return f"[headline] {' and '.join(same)} unchanged"
    return (f"[headline] {' and '.join(rel(p) for p in changed)} updated"
            + (f"; {' and '.join(same)} unchanged" if same else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="replace the blocks in README.md and docs/results.md")
    args = ap.parse_args(argv)
    refuse_uncommitted_sources(sources())
    head, figures, t2 = headline(), all_figures(), table2()
    print(head, "\n", figures, "\n", t2, sep="\n")
    if args.write:
        blocks = [(ROOT / "README.md", "headline", head), (ROOT / "docs" / "results.md", "figures", figures),
                  (ROOT / "docs" / "results.md", "table2", t2),
                  (ROOT / "docs" / "results.md", "capacity", capacity_tables()),
                  (ROOT / "docs" / "results.md", "capacity-decode", capacity_tables(claims.DECODE)),
                  *((ROOT / "docs" / "results.md", name, capacity_tables(path)) for name, path in CAPACITY_MORE.items())]
        refuse_absolute_paths(blocks)
        print(write(blocks))


def refuse_absolute_paths(blocks) -> None:
    """Exit, writing nothing, if a block would put an absolute path (a command run with `--model
    /home/me/...`) into the README or docs/results.md: a cited command must run from any checkout."""
    found = [f"  {rel(path)} ({name}): {p} in: ...{line[max(0, line.index(p) - 80):line.index(p) + len(p) + 20]}..."
             for path, name, body in blocks for line in body.splitlines()
             for p in provenance.absolute_paths(line)]
    if found:
        raise SystemExit("eval.reports.headline: refusing to write absolute paths (make the command in the results.json "
                         "it cites relative to the repository):\n" + "\n".join(found))


if __name__ == "__main__":
    main()
