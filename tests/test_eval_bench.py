"""The CPU attention benchmark still runs against the backend it measures (no GPU needed)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_cpu_attention_bench_runs_and_checks_itself():
    # It asserts mepic's output equals torch_native's before it prints a timing, so a row is a check.
    done = subprocess.run([sys.executable, "eval/bench_attention.py", "--repeat", "1"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (prefill|decode) \| \d+ x \d+ \| (\d+) \|", done.stdout, re.M)
    assert sorted(rows) == sorted([(case, ctx) for case in ("prefill", "decode") for ctx in ("1024", "4096")])
    assert len(re.findall(r"^\| (decode|extend) \| torch\.\w+ \| [0-9.e+-]+ \|$", done.stdout, re.M)) == 6
