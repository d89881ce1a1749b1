"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tooling/test_gpu_e2e_drive.py."""

import shutil
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]


TINY = ROOT / "models" / "tiny"


def tokenizer_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "carry" / "model"
    folder.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(TINY / f, folder / f)
    return folder
