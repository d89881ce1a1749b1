"""Register and warm a corpus on a running server: the command-line form of `POST /mepic/chunks`.

    python -m sglang_mepic.launch.warm corpus/                     # every .txt and .md file below corpus/
    python -m sglang_mepic.launch.warm corpus.jsonl --field text   # one document a line
    python -m sglang_mepic.launch.warm a.txt b.txt --url http://127.0.0.1:30000 --cache-salt tenant-a

A file is one document (a `.jsonl` file: one a line, its `--field`). Documents go to the server in
requests of at most 256; each is registered in the namespace given (`--extra-key`, `--cache-salt`)
and, unless `--no-warm`, compiled and stored right away, so the first user's request reuses it. The
server must run with `--mepic-auto-chunk known` (or messages+known, tools+known). Prints how many
were new and where their chunks were (absent: compiled now). A document is its own text: one that
holds chunk markup (this repository's docs/, which documents it) is refused. Exit status 1, with
one line that says why, when a path is missing or unreadable, the server cannot be reached, or it
refuses a request (its reason, and the file it is about).
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import requests
from tqdm import tqdm

# The route's path and its most texts a request (frontend/known_routes.py, which tests/tooling/test_documented_requests.py
# checks): named here, since importing the server's route module pulls in SGLang (half a minute, and its
# CUDA-only warnings on a CPU) into a client that only posts JSON.
ROUTE = "/mepic/chunks"
MAX_TEXTS = 256
PROG = "sglang_mepic.launch.warm"
SUFFIXES = (".txt", ".md")


class WarmError(Exception):
    """What stops the command, said in one line (no traceback)."""


def _read(file: Path) -> str:
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise WarmError(f"{file}: no such file or folder") from None
    except UnicodeDecodeError as e:
        raise WarmError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise WarmError(f"{file}: cannot be read ({e.strerror})") from None


def _records(file: Path, field: str) -> list[tuple[str, str]]:
    """(where, text) of each record of a .jsonl file."""
    out = []
    for n, line in enumerate(_read(file).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            raise WarmError(f"{file}:{n}: not a JSON line ({e})") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise WarmError(f"{file}:{n}: no string field {field!r} (--field names it)")
        out.append((f"{file}:{n}", record[field]))
    return out


def documents(paths: list[str], field: str) -> list[tuple[str, str]]:
    """(where, text) of every document the paths name, in a stable order."""
    out = []
    for name in paths:
        path = Path(name)
        files = sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES + (".jsonl",)) if path.is_dir() else [path]
        for file in files:
            out += _records(file, field) if file.suffix == ".jsonl" else [(str(file), _read(file))]
    return out


def _post(url: str, body: dict) -> requests.Response:
    try:
        return requests.post(url.rstrip("/") + ROUTE, timeout=3600, json=body)
    except requests.RequestException as e:
        reason = type(e).__name__ if isinstance(e, requests.ConnectionError) else str(e)
        raise WarmError(f"cannot reach the server at {url} ({reason}): is it running, with --mepic-auto-chunk "
                        "known?") from None


def _refusal(r: requests.Response, batch: list[tuple[str, str]]) -> str:
    """The server's reason for refusing a batch, naming the file it is about."""
    try:
        error = r.json()["error"]
        reason, index = error["message"], error.get("index")
    except (ValueError, KeyError, TypeError, AttributeError):
        reason, index = r.text.strip() or r.reason, None
    where = f" ({batch[index][0]})" if isinstance(index, int) and 0 <= index < len(batch) else ""
    return f"refused ({r.status_code}){where}: {reason}"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except WarmError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__,
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
        raise WarmError(f"no documents in {' '.join(args.paths)} (files ending in {', '.join(SUFFIXES)} or .jsonl)")
    fields = {k: v for k, v in (("extra_key", args.extra_key), ("cache_salt", args.cache_salt)) if v is not None}
    registered: Counter[str] = Counter()
    chunks: Counter[str] = Counter()
    # leave=False: the bar goes when it closes, so a refusal is the one line left on a terminal (and there is
    # no bar where stderr is not a terminal: disable=None)
    with tqdm(total=len(docs), unit="doc", desc="warm", leave=False, disable=None) as bar:
        for i in range(0, len(docs), MAX_TEXTS):
            batch = docs[i:i + MAX_TEXTS]
            r = _post(args.url, {"texts": [t for _, t in batch], "warm": not args.no_warm, **fields})
            if r.status_code != 200:
                raise WarmError(_refusal(r, batch))
            for entry in r.json()["texts"]:
                registered[entry["registered"]] += 1
                chunks[entry.get("chunk", "not warmed")] += 1
            bar.update(len(batch))
    print(f"{len(docs)} documents: {registered['new']} new, {registered['known']} known already; chunks "
          + ", ".join(f"{n} {where}" for where, n in sorted(chunks.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
