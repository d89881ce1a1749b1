"""A model folder's identity by content: what its weights compute, wherever the folder lies.

Two users of it: chunk KV kept in storage that outlives the process (a file
directory, Mooncake), whose keys must change when the weights do even if the
path does not, and the accuracy gate's cached verdicts. Every file is hashed
whole: a fine-tune may change a few MiB in the middle of one shard.
"""

import hashlib
import os
from pathlib import Path

BLOCK = 8 << 20


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()


def digest(model_path: str | os.PathLike) -> str:
    """The folder's files (names relative to it, and contents); dot-files are not the model."""
    folder = Path(model_path).expanduser().resolve()
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        h.update(f"{path.relative_to(folder)}\0{file_digest(path)}\0".encode())
    return h.hexdigest()[:32]
