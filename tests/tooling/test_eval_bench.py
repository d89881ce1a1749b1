"""The CPU attention benchmark still runs against the backend it measures (no GPU needed)."""

import re
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_cpu_attention_bench_runs_and_checks_itself(capsys, monkeypatch):
    # `python eval/bench/attention.py --repeat 1 --contexts 256,512`, in this process (SGLang's imports are
    # already paid): the smallest run. It asserts mepic's output equals torch_native's before it prints a
    # timing, so a row is a check.
    monkeypatch.setattr(sys, "argv", ["eval/bench/attention.py", "--repeat", "1", "--contexts", "256,512"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(ROOT / "eval" / "bench" / "attention.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out[-3000:]
    rows = re.findall(r"^\| (prefill|decode) \| \d+ x \d+ \| (\d+) \|", out, re.M)
    assert sorted(rows) == sorted([(case, ctx) for case in ("prefill", "decode") for ctx in ("256", "512")])
    assert len(re.findall(r"^\| (decode|extend) \| torch\.\w+ \| [0-9.e+-]+ \|$", out, re.M)) == 6
