"""Register and warm a corpus on a running server: the command-line form of `POST /mepic/chunks`.

    python -m sglang_mepic.launch.warm docs/                       # every .txt and .md file below docs/
    python -m sglang_mepic.launch.warm corpus.jsonl --field text   # one document a line
    python -m sglang_mepic.launch.warm a.txt b.txt --url http://127.0.0.1:30000 --cache-salt tenant-a

A file is one document (a `.jsonl` file: one a line, its `--field`). Documents go to the server in
requests of at most 256; each is registered in the namespace given (`--extra-key`, `--cache-salt`)
and, unless `--no-warm`, compiled and stored right away, so the first user's request reuses it. The
server must run with `--mepic-auto-chunk known` (or messages+known, tools+known). Prints how many
were new and where their chunks were (absent: compiled now). Exit status 1 when the server refuses
a request, with its reason.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import requests
from tqdm import tqdm

from sglang_mepic.frontend.known_routes import MAX_TEXTS, ROUTE

SUFFIXES = (".txt", ".md")


def documents(paths: list[str], field: str) -> list[tuple[str, str]]:
    """(where, text) of every document the paths name, in a stable order."""
    out = []
    for name in paths:
        path = Path(name)
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES + (".jsonl",)) if path.is_dir() else [path]
        for file in files:
            if file.suffix == ".jsonl":
                for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
                    if line.strip():
                        record = json.loads(line)
                        if not isinstance(record, dict) or not isinstance(record.get(field), str):
                            raise SystemExit(f"{file}:{n}: no string field {field!r} (--field names it)")
                        out.append((f"{file}:{n}", record[field]))
            else:
                out.append((str(file), file.read_text(encoding="utf-8")))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_mepic.launch.warm", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", help="files or folders of documents")
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--field", default="text", help="the text field of .jsonl records (default: text)")
    parser.add_argument("--extra-key", default=None)
    parser.add_argument("--cache-salt", default=None)
    parser.add_argument("--no-warm", action="store_true", help="register only; compile on first use")
    args = parser.parse_args(argv)
    docs = documents(args.paths, args.field)
    if not docs:
        print("no documents found", file=sys.stderr)
        return 1
    fields = {k: v for k, v in (("extra_key", args.extra_key), ("cache_salt", args.cache_salt)) if v is not None}
    registered, chunks = Counter(), Counter()
    with tqdm(total=len(docs), unit="doc", desc="warm") as bar:
        for i in range(0, len(docs), MAX_TEXTS):
            batch = docs[i:i + MAX_TEXTS]
            r = requests.post(args.url.rstrip("/") + ROUTE, timeout=3600,
                              json={"texts": [t for _, t in batch], "warm": not args.no_warm, **fields})
            if r.status_code != 200:
                try:
                    error = r.json()["error"]
                    reason, index = error["message"], error.get("index")
                except (ValueError, KeyError, TypeError, AttributeError):
                    reason, index = r.text, None
                # name the file the server's refusal is about
                where = f" ({batch[index][0]})" if isinstance(index, int) and 0 <= index < len(batch) else ""
                print(f"refused ({r.status_code}){where}: {reason}", file=sys.stderr)
                return 1
            for entry in r.json()["texts"]:
                registered[entry["registered"]] += 1
                chunks[entry.get("chunk", "not warmed")] += 1
            bar.update(len(batch))
    print(f"{len(docs)} documents: {registered['new']} new, {registered['known']} known already; chunks "
          + ", ".join(f"{n} {where}" for where, n in sorted(chunks.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
