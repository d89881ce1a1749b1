"""The finished points of an eval.experiments.run, kept on disk so that a stopped run can resume.

A paper sweep runs 60-100 minutes on 2 cores and writes its table only at the
end; without this, a run stopped at minute 90 (a crash, a reboot, a session that
ends) leaves nothing. Each (system, point) is appended to `points.jsonl` in the
output folder as soon as it ends, so a stop loses the point in flight and no
more. `--resume` then keeps the finished points and runs the rest.

The first line holds the settings that shape every point (dataset, requests,
model, ...). A resume under other settings would mix two experiments in one
table, so it is refused. The planned points and systems may differ: points
outside the new plan stay in the file but not in the table.

A finished run packs `points.jsonl` into `points.jsonl.xz` (the same lines, xz;
a paper sweep's 6.6 MB are 0.46 MB) and removes the plain file: the packed one is
what is committed. A resumed run of a packed folder leaves the packed file as it
is and appends to a new `points.jsonl` that holds a header and the points it adds;
readers (`read_points`) read the packed points and then the plain ones, and the
next pack merges the two. `python -m eval.lib.checkpoint pack FOLDER...` packs a
folder by hand (one written before runs packed, or one a --tables-only read).
"""

import argparse
import json
import lzma
import os
import sys
from pathlib import Path

NAME = "points.jsonl"
PACKED = NAME + ".xz"
SET_ASIDE = "points.prev.jsonl"
# xz over gzip -9: 12.6x against 8.3x on the committed results (4.5 MB against 6.9 MB for 57 MB),
# at 3.5 s to pack a 6.6 MB sweep once it ends and 40 ms to read it back.
PRESET = 9 | lzma.PRESET_EXTREME


def key(record: dict) -> tuple:
    # Points written before repeats existed ran the settings' seed, 0 by default.
    return record["system"], record["qps"], record["chunks"], record["reuse"], record.get("seed", 0)


def exists(folder: Path) -> bool:
    return (folder / NAME).exists() or (folder / PACKED).exists()


def _parse(path: Path) -> tuple[str, dict, list[tuple[str, dict]]]:
    """(header line, header, [(line, record)]) of one file; a last line cut short by a stop is dropped."""
    data = path.read_bytes()
    lines = (lzma.decompress(data) if path.name.endswith(".xz") else data).decode().split("\n")
    try:
        head = json.loads(lines[0]) if lines[0] else {}
    except json.JSONDecodeError:
        head = {}
    if not isinstance(head, dict) or "settings" not in head:
        raise ValueError(f"{path} is not an eval.experiments.run checkpoint; remove it or choose another --out")
    records = []
    for line in lines[1:]:
        if not line:
            continue
        try:
            records.append((line, json.loads(line)))
        except json.JSONDecodeError:
            break  # the line being written when the run stopped
    return lines[0], head, records


def _merged(folder: Path) -> tuple[str, dict, dict[tuple, tuple[str, dict, bool]]]:
    """The header line and header of a folder's checkpoint and its points by key: (line, record, in the
    plain file), the packed points first, then those appended since; a key in both keeps the later
    record in the earlier place (as a resumed checkpoint does)."""
    plain, packed = folder / NAME, folder / PACKED
    if not plain.exists() and not packed.exists():
        raise FileNotFoundError(f"{plain} does not exist (nor {PACKED}; an eval.experiments.run --out folder holds one)")
    parts = [(p, p == plain) for p in (packed, plain) if p.exists()]
    head_line, head, points = "", {}, {}
    for path, is_plain in parts:
        head_line, this, records = _parse(path)
        if head and this["settings"] != head["settings"]:
            raise ValueError(f"{plain} and {packed} were written with other settings; move one of them away")
        head = this
        for line, record in records:
            points[key(record)] = (line, record, is_plain)
    return head_line, head, points


def _text(folder: Path) -> str:
    """The folder's checkpoint as one file: the header line, then every point's line."""
    head_line, _, points = _merged(folder)
    return "\n".join([head_line, *(line for line, _, _ in points.values())]) + "\n"


def read(folder: Path) -> tuple[dict, list[dict]]:
    """The header (settings, invocations) and the finished points of an eval.experiments.run --out folder,
    packed or not. FileNotFoundError when it holds neither file, ValueError when it is not a checkpoint."""
    _, head, points = _merged(folder)
    return head, [record for _, record, _ in points.values()]


def read_points(folder: Path) -> list[dict]:
    """The finished points of an eval.experiments.run --out folder (what follows the header line), packed or not."""
    return read(folder)[1]


def pack(folder: Path) -> Path | None:
    """Packs the folder's points.jsonl (merged after points.jsonl.xz, if that exists) into points.jsonl.xz
    and removes it; None when there is no plain file (already packed). The packed file is read back
    before the plain one goes."""
    plain, packed = folder / NAME, folder / PACKED
    if not plain.exists():
        if packed.exists():
            return None
        raise FileNotFoundError(f"{plain} does not exist (nor {PACKED}; an eval.experiments.run --out folder holds one)")
    text = _text(folder).encode()
    data = lzma.compress(text, preset=PRESET)
    if lzma.decompress(data) != text:
        raise RuntimeError(f"{packed}: the packed points do not read back; {plain} is left as it is")
    tmp = folder / (PACKED + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, packed)  # a stop here leaves both files, which read as one (the keys repeat)
    plain.unlink()
    return packed


class Checkpoint:
    def __init__(self, out: Path, settings: dict, resume: bool, read_only: bool = False):
        """read_only: load the kept points and leave the files as they are (tables from a checkpoint:
        no run is added, so the count of invocations that ran points stays)."""
        self.out = out
        self.path = out / NAME  # where points are appended
        self.packed = out / PACKED
        self.settings = settings
        self.records: dict[tuple, dict] = {}
        self.invocations = 1
        self.set_aside = None
        plain_keys: set | None = None  # the points the plain file holds (None: all)
        if read_only:
            if exists(out):
                self._load()
                self.invocations -= 1
            return
        if resume and exists(out):
            plain_keys = self._load()
        elif self.packed.exists():
            # Kept once, so that a rerun without --resume does not wipe an hour of points.
            self.set_aside = out / SET_ASIDE
            self.set_aside.write_text(_text(out))
            self.packed.unlink()
            self.path.unlink(missing_ok=True)
        elif self.path.exists():
            self.set_aside = out / SET_ASIDE
            self.path.replace(self.set_aside)
        # Rewritten whole: this drops a last line cut short by the stop. Points already packed stay there.
        lines = [json.dumps({"settings": settings, "invocations": self.invocations})]
        lines += [json.dumps(r) for k, r in self.records.items() if plain_keys is None or k in plain_keys]
        self.path.write_text("\n".join(lines) + "\n")

    @property
    def source(self) -> str:
        """The files the kept points are read from, for messages."""
        return " and ".join(str(p) for p in (self.packed, self.path) if p.exists()) or str(self.path)

    def _load(self) -> set | None:
        _, head, points = _merged(self.out)
        if head["settings"] != self.settings:
            changed = sorted(k for k in {*head["settings"], *self.settings}
                             if head["settings"].get(k) != self.settings.get(k))
            raise ValueError(f"{self.source} was written with other settings ("
                             + ", ".join(f"{k}: {head['settings'].get(k)!r} then, {self.settings.get(k)!r} now"
                                         for k in changed)
                             + "); drop --resume to start afresh, or choose another --out")
        self.invocations = head.get("invocations", 1) + 1
        self.records = {k: record for k, (_, record, _) in points.items()}
        return {k for k, (_, _, is_plain) in points.items() if is_plain} if self.packed.exists() else None

    def get(self, system: str, qps: float, chunks: int, reuse: float | None, seed: int = 0) -> dict | None:
        return self.records.get((system, qps, chunks, reuse, seed))

    def add(self, record: dict) -> None:
        self.records[key(record)] = record
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def pack(self) -> Path | None:
        """At the end of a run: the points into points.jsonl.xz, the plain file removed."""
        return pack(self.out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m eval.lib.checkpoint", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help=f"pack each folder's {NAME} into {PACKED} (merged with one already there)")
    p.add_argument("folders", nargs="+", type=Path, metavar="FOLDER")
    args = ap.parse_args(argv)
    failed = False
    for folder in args.folders:
        try:
            before = (folder / NAME).stat().st_size if (folder / NAME).exists() else None
            packed = pack(folder)
        except (OSError, ValueError, RuntimeError, lzma.LZMAError) as e:
            print(f"{folder}: {e}", file=sys.stderr)
            failed = True
            continue
        if packed is None:
            print(f"{folder}: already packed ({PACKED})")
        else:
            print(f"{folder}: {len(read_points(folder))} points, {before:,} bytes -> {packed.stat().st_size:,} "
                  f"bytes in {PACKED}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
