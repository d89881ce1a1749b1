"""eval.experiments.run refuses bad arguments before it builds a model or starts a server."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args, message", [
    (["--pool-pages", "10"], "bad arguments: --pool-pages 10 (at least 64)"),
    (["--paper", "--qps", "4"], "bad arguments: --paper sets QPS, chunks and reuse itself"),
])
def test_bad_arguments_are_refused_clearly(args, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "eval.experiments.run", *args, "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and message in done.stderr
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize("args, message", [
    (["eval.bench.forward_cost", "--context", "0,100"],
     "bad arguments: --context 0,100 (two lengths or more, each a multiple of 128)"),
    (["eval.bench.forward_cost", "--context", "0,128", "--head", "-1"], "--head -1 (>= 0)"),
    (["eval.reports.compare", "nowhere", "mepic", "epic-16"], "nowhere/points.jsonl does not exist"),
])
def test_the_probes_refuse_bad_arguments_before_starting_a_server(args, message, tiny_model):
    model = ["--model", tiny_model] if args[0] == "eval.bench.forward_cost" else []
    done = subprocess.run([sys.executable, "-m", *args, *model], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode != 0 and message in done.stderr
