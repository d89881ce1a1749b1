"""TTFT taken apart, for the requests that computed a chunk and for those whose chunks were all stored.

    .venv/bin/python -m eval.reports.ttft_split eval/results/compile-rows/smol-squad-after [more eval.experiments.run --out folders]

Reads the per-request outputs eval.experiments.run keeps (points.jsonl.xz, or points.jsonl while a run is going)
and prints, per folder, system and group, the medians of: TTFT, the time before the scheduler's queue
(tokenizing, dispatch), the queue, the prefill forward (SGLang's meta_info times, as eval.experiments.run's
tokenize/queue/forward columns), the chunk tokens compiled for the request (`mepic_compiled_tokens`)
and the prompt tokens it recomputed. A request "computes a chunk" when its `mepic_compiled_tokens` is
above 0.
"""

import statistics
import sys
from pathlib import Path

from eval.lib.checkpoint import read_points


def groups(folder: Path) -> dict:
    points = read_points(folder)
    out: dict = {}
    for p in points:
        for o in p["outputs"]:
            meta = o[2]
            if len(o) < 6 or "forward_entry_time" not in meta:
                continue
            group = "computes a chunk" if meta.get("mepic_compiled_tokens", 0) else "all stored"
            queue = meta["queue_time"]
            out.setdefault((p["system"], group), []).append((
                o[3], meta["forward_entry_time"] - queue - o[5], queue,
                meta["prefill_finished_time"] - meta["forward_entry_time"], meta.get("mepic_compiled_tokens", 0),
                meta.get("mepic_recomputed_tokens", meta["prompt_tokens"] - meta["cached_tokens"])))
    return out


def main(argv=None) -> None:
    names = ("TTFT", "before queue", "queue", "forward", "compiled tok", "recomputed tok")
    print("| run | system | requests | n | " + " | ".join(f"{n} p50" for n in names) + " |")
    print("|---|---|---|---|" + "---|" * len(names))
    for arg in argv if argv is not None else sys.argv[1:]:
        folder = Path(arg)
        try:
            found = groups(folder)
        except (FileNotFoundError, ValueError) as e:
            sys.exit(f"bad arguments: {e}")
        for (system, group), rows in sorted(found.items()):
            cells = [statistics.median(col) for col in zip(*rows)]
            print(f"| {folder.name} | {system} | {group} | {len(rows)} | "
                  + " | ".join(f"{v:.3f}" if i < 4 else f"{v:.0f}" for i, v in enumerate(cells)) + " |")


if __name__ == "__main__":
    main()
