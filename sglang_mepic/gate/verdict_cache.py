"""Accuracy-gate verdicts kept on disk, so a restart with `--mepic-verify` does not pay the check again.

A verdict is kept per model fingerprint (its files' contents, hashed whole, not
its path: a copied or moved model keeps its verdict, retrained or fine-tuned
weights in the same folder do not) and per everything else the figures depend
on: the mode, the other MEPIC settings, the server flags, the thresholds, the
number of questions, the calibration set and this package's code. The directory is `$SGLANG_MEPIC_CACHE_DIR`, else
`$XDG_CACHE_HOME/sglang-mepic`, else `~/.cache/sglang-mepic`, under `verdicts/`.

The directory may be shared storage, so a record is not taken on trust: one that
this user does not own, or that others may write, is not used (the gate runs
again), and a record's verdict is judged again from its figures against the
key's mode and thresholds, never read from its `failures` list.
"""

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from sglang_mepic.gate import calibration
from sglang_mepic.gate import verdict as gate
from sglang_mepic.tiers import weights

CACHE_DIR_ENV = "SGLANG_MEPIC_CACHE_DIR"
PACKAGE = Path(__file__).resolve().parents[1]  # the whole package, not gate/ alone


def cache_dir() -> Path:
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "sglang-mepic"


def code_fingerprint() -> str:
    """The code that computes the figures (this package, kernels included): a verdict measured
    before a change to how KV is reused is not taken after it."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        h.update(f"{path.relative_to(PACKAGE)}\0{weights.file_digest(path)}\0".encode())
    return h.hexdigest()[:16]


def model_fingerprint(model_path: str | os.PathLike) -> str:
    return weights.digest(model_path)


def key(fingerprint: str, mode: str, questions: int, thresholds: gate.Thresholds, settings: dict) -> dict:
    return {"model": fingerprint, "mode": mode, "questions": questions, "thresholds": asdict(thresholds),
            "calibration": hashlib.sha256(calibration.DATA.read_bytes()).hexdigest()[:16],
            "positions": gate.POSITIONS, "top_k": gate.TOP_K, "code": code_fingerprint(), "settings": settings}


def _path(k: dict) -> Path:
    name = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir() / "verdicts" / f"{name}.json"


def _trusted(path: Path) -> bool:
    """Whether only this user could have written the file (POSIX; elsewhere, always)."""
    if not hasattr(os, "getuid"):
        return True
    st = path.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def load(k: dict) -> gate.Verdict | None:
    """The verdict stored under this key, or None (none stored, unreadable or untrusted)."""
    try:
        path = _path(k)
        if not _trusted(path):
            return None
        record = json.loads(path.read_text())
        if record["key"] != k:
            return None
        figures = gate.Figures(**record["figures"])
        if figures.questions != k["questions"]:
            return None
        return gate.judge(k["mode"], figures, gate.Thresholds(**k["thresholds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def store(k: dict, verdict: gate.Verdict) -> Path:
    path = _path(k)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"key": k, "mode": verdict.mode, "figures": asdict(verdict.figures),
              "thresholds": asdict(verdict.thresholds), "failures": list(verdict.failures)}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:  # its owner's alone
        f.write(json.dumps(record, indent=1, sort_keys=True))
    tmp.replace(path)  # atomic: a concurrent start reads the old record or the new one
    return path
