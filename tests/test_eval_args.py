"""eval.run refuses bad arguments before it builds a model or starts a server."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args, message", [
    (["--pool-pages", "10"], "bad arguments: --pool-pages 10 (at least 64)"),
    (["--paper", "--qps", "4"], "bad arguments: --paper sets QPS, chunks and reuse itself"),
])
def test_bad_arguments_are_refused_clearly(args, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "eval.run", *args, "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written
