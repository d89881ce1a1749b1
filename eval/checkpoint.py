"""The finished points of an eval.run, kept on disk so that a stopped run can resume.

A paper sweep runs 60-100 minutes on 2 cores and writes its table only at the
end; without this, a run stopped at minute 90 (a crash, a reboot, a session that
ends) leaves nothing. Each (system, point) is appended to `points.jsonl` in the
output folder as soon as it ends, so a stop loses the point in flight and no
more. `--resume` then keeps the finished points and runs the rest.

The first line holds the settings that shape every point (dataset, requests,
model, ...). A resume under other settings would mix two experiments in one
table, so it is refused. The planned points and systems may differ: points
outside the new plan stay in the file but not in the table.
"""

import json
from pathlib import Path

NAME = "points.jsonl"


def key(record: dict) -> tuple:
    # Points written before repeats existed ran the settings' seed, 0 by default.
    return record["system"], record["qps"], record["chunks"], record["reuse"], record.get("seed", 0)


class Checkpoint:
    def __init__(self, out: Path, settings: dict, resume: bool, read_only: bool = False):
        """read_only: load the kept points and leave the file as it is (tables from a checkpoint:
        no run is added, so the count of invocations that ran points stays)."""
        self.path = out / NAME
        self.settings = settings
        self.records: dict[tuple, dict] = {}
        self.invocations = 1
        self.set_aside = None
        if read_only:
            if self.path.exists():
                self._load()
                self.invocations -= 1
            return
        if resume and self.path.exists():
            self._load()
        elif self.path.exists():
            # Kept once, so that a rerun without --resume does not wipe an hour of points.
            self.set_aside = self.path.with_name("points.prev.jsonl")
            self.path.replace(self.set_aside)
        # Rewritten whole: this drops a last line cut short by the stop.
        lines = [json.dumps({"settings": settings, "invocations": self.invocations})]
        lines += [json.dumps(r) for r in self.records.values()]
        self.path.write_text("\n".join(lines) + "\n")

    def _load(self) -> None:
        lines = self.path.read_text().splitlines()
        try:
            head = json.loads(lines[0]) if lines else {}
        except json.JSONDecodeError:
            head = {}
        if "settings" not in head:
            raise ValueError(f"{self.path} is not an eval.run checkpoint; remove it or choose another --out")
        if head["settings"] != self.settings:
            changed = sorted(k for k in {*head["settings"], *self.settings}
                             if head["settings"].get(k) != self.settings.get(k))
            raise ValueError(f"{self.path} was written with other settings ("
                             + ", ".join(f"{k}: {head['settings'].get(k)!r} then, {self.settings.get(k)!r} now"
                                         for k in changed)
                             + "); drop --resume to start afresh, or choose another --out")
        self.invocations = head.get("invocations", 1) + 1
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                break  # the line being written when the run stopped
            self.records[key(record)] = record

    def get(self, system: str, qps: float, chunks: int, reuse: float | None, seed: int = 0) -> dict | None:
        return self.records.get((system, qps, chunks, reuse, seed))

    def add(self, record: dict) -> None:
        self.records[key(record)] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
