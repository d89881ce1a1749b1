"""Two systems of one eval.experiments.run checkpoint, compared seed by seed and request by request.

    python -m eval.reports.compare eval/results/smollm2/squad mepic epic-16

The tables give each system's median over its requests. Where two systems ran the
same seed they received the same prompts at the same moments, so their requests
pair up, and a difference that a median shows can be traced: is it in every
request's forward, or only in where the median of a two-mode distribution
(requests whose chunks were stored, requests that waited for a compile) falls?
Prints, per seed: TTFT p50 and mean of each system and their ratios, and over
the requests neither system held for a compile, the paired difference of the
prefill forward (deciles 10 / 50 / 90). Then, per system and seed, the forward
of those requests split by whether another request was in flight meanwhile:
a request alone is what eval.bench.forward_cost measures, so the two can be set side
by side.
"""

import argparse
import statistics
import sys
from pathlib import Path

from eval.experiments.run import computed_tokens, pct, ttft_parts
from eval.lib.checkpoint import key, read_points


def load(folder: Path) -> dict[tuple, dict]:
    try:
        return {key(r): r for r in read_points(folder)}
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"bad arguments: {e}")


def compiled(output) -> bool:
    return output[2].get("mepic_compiled_tokens", 0) > 0


def compare(records: dict[tuple, dict], a: str, b: str) -> list[dict]:
    """One row per (point, seed) that both systems ran."""
    rows = []
    for k, ra in sorted(records.items(), key=lambda kv: kv[0][1:]):
        if k[0] != a or (rb := records.get((b, *k[1:]))) is None:
            continue
        oa, ob = ra["outputs"], rb["outputs"]
        if len(oa) != len(ob):
            continue
        ta, tb = [o[3] for o in oa], [o[3] for o in ob]
        fwd = [pa[2] - pb[2] for x, y in zip(oa, ob)
               if not compiled(x) and not compiled(y)
               and (pa := ttft_parts(x)) is not None and (pb := ttft_parts(y)) is not None]
        deciles = statistics.quantiles(fwd, n=10) if len(fwd) >= 2 else []
        rows.append({
            "qps": k[1], "chunks": k[2], "reuse": k[3], "seed": k[4], "requests": len(oa),
            "p50": (pct(ta, 0.5), pct(tb, 0.5)), "mean": (statistics.fmean(ta), statistics.fmean(tb)),
            "paired": len(fwd), "forward_diff": (deciles[0], deciles[4], deciles[8]) if deciles else None,
        })
    return rows


def alone(outputs) -> tuple[list, list]:
    """(forward, tokens computed) of the requests not held for a compile: those during whose wait
    and forward no other request was in flight, and the others."""
    spans = [(o[5], o[5] + o[4]) for o in outputs]
    solo, shared = [], []
    for i, o in enumerate(outputs):
        parts = ttft_parts(o)
        if compiled(o) or parts is None:
            continue
        meta = o[2]
        start, end = o[5], meta["prefill_finished_time"]
        busy = any(j != i and s < end and e > start for j, (s, e) in enumerate(spans))
        (shared if busy else solo).append((parts[2], computed_tokens(meta)))
    return solo, shared


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="an eval.experiments.run --out folder (its points.jsonl.xz or points.jsonl)")
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args(argv)
    records = load(args.folder)
    rows = compare(records, args.a, args.b)
    if not rows:
        sys.exit(f"no (point, seed) run by both {args.a} and {args.b} in {args.folder}")
    a, b = args.a, args.b
    print(f"| QPS | chunks | reuse | seed | TTFT p50 {a} / {b} s | ratio | TTFT mean {a} / {b} s | ratio "
          f"| requests stored in both | forward {a} − {b}, deciles 10 / 50 / 90 s |")
    print("|---" * 10 + "|")
    for r in rows:
        (pa, pb), (ma, mb) = r["p50"], r["mean"]
        diff = " / ".join(f"{d:+.3f}" for d in r["forward_diff"]) if r["forward_diff"] else "—"
        print(f"| {r['qps']:g} | {r['chunks']} | {r['reuse'] if r['reuse'] is not None else '—'} | {r['seed']} "
              f"| {pa:.3f} / {pb:.3f} | {pa / pb:.2f} | {ma:.3f} / {mb:.3f} | {ma / mb:.2f} "
              f"| {r['paired']} of {r['requests']} | {diff} |")
    print(f"\n| system | QPS | chunks | seed | alone: requests, forward p50 s, computed tok p50 "
          f"| with others in flight: requests, forward p50 s, computed tok p50 |")
    print("|---" * 6 + "|")
    for system in (a, b):
        for k, rec in sorted(records.items(), key=lambda kv: kv[0][1:]):
            if k[0] != system:
                continue
            cells = []
            for group in alone(rec["outputs"]):
                cells.append(f"{len(group)}, {pct([f for f, _ in group], 0.5):.3f}, "
                             f"{pct([d for _, d in group], 0.5):.0f}" if group else "0")
            print(f"| {system} | {k[1]:g} | {k[2]} | {k[4]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
