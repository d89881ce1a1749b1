"""The GPU end-to-end script (eval/gpu/e2e), checked here without CUDA: the model it writes loads, its checks
can fail, its parts merge, and `run.sh --cpu --smoke` goes through every step against a real CPU server."""

import json
import os
import subprocess
import sys

from eval.gpu.e2e import drive  # the eval package is registered by conftest.py
from support.gpu_e2e_drive import ROOT, TINY, tokenizer_folder


def test_run_sh_cpu_smoke_goes_through_every_step(tmp_path):
    tokenizer_folder(tmp_path)
    carry = tmp_path / "carry"
    subprocess.run([sys.executable, "-m", "eval.gpu.e2e.workload", "--tokenizer", str(TINY), "--requests", "24",
                    "--out", str(carry / "workload.json")], cwd=ROOT, check=True, timeout=300)
    work = json.loads((carry / "workload.json").read_text())
    assert len(work["texts"]) == 24 and work["checks"] and work["chunks"] == 7
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "CARRY": str(carry), "PY": sys.executable}
    run = subprocess.run(["bash", str(ROOT / "eval/gpu/e2e/run.sh"), "--cpu", "--smoke", "--checks", "3",
                          "--new-tokens", "4", "--pool-pages", "1024", "--budget", "900"],
                         env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    mepic = results["systems"]["mepic"]
    assert "error" not in mepic
    assert mepic["server"]["attention_backend"] == "mepic" and mepic["server"]["radix_cache_backend"] == "mepic"
    assert [p["requests"] for p in mepic["points"]] == [16]
    assert len(mepic["checks_cold"]) == 3 and all(len(t) == drive.TOP for t in mepic["checks_cold"])
    assert mepic["warm_vs_cold"]["ok"]  # the invariant: a warm cache does not change a first token's logprobs
    assert mepic["abort_flush"]["ok"] and mepic["abort_flush"]["pages_after_flush"] == 0
    # Issue 69's steps, on CPU: the greedy pass twice (no graphs here: not judged), the TTFT parts of every
    # request, the decode profile at the smoke's batches; the sync probe needs CUDA.
    greedy = mepic["greedy_graphs_vs_eager"]
    assert greedy["identical"] == greedy["prompts"] == 3 and not greedy["judged"]
    assert mepic["points"][0]["ttft_parts"]["requests"] == 16 and "decode_step_windows" in mepic["points"][0]
    assert [r["batch"] for r in mepic["decode_profile"]] == [2, 4] and "sync_probe" not in mepic
    assert (out / "table.md").is_file() and (out / "logs.tar.gz").is_file() and (out / "log.txt").is_file()
    assert not list(out.glob("server-*.log"))  # packed into logs.tar.gz


def test_the_device_capacity_path_runs_here_and_a_later_call_goes_on_from_its_cells(tmp_path):
    """Issue 71's device path, dry: the carry's capacity prompts, drive.py's model and servers (torch_native as
    vanilla here, triton there), eval.experiments.capacity's search and report; then a call given the first's cells runs
    nothing more and reports them."""
    tokenizer_folder(tmp_path)
    carry = tmp_path / "carry"
    subprocess.run([sys.executable, "-m", "eval.gpu.e2e.workload", "--tokenizer", str(TINY), "--requests", "8",
                    "--out", str(carry / "workload.json"), "--capacity-out", str(carry / "capacity.json.xz"),
                    "--capacity-seeds", "0", "--capacity-requests", "12"], cwd=ROOT, check=True, timeout=300)
    env = {**os.environ, "CARRY": str(carry), "PY": sys.executable}
    args = ["bash", str(ROOT / "eval/gpu/e2e/run.sh"), "capacity", "--cpu", "--part", "1", "--requests", "12",
            "--max-probes", "1", "--new-tokens", "4", "--warmup", "0"]
    first = subprocess.run(args, env={**env, "OUT": str(tmp_path / "one")}, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = tmp_path / "one" / "capacity-squad"
    cells = [json.loads(line) for line in (out / "cells.jsonl").read_text().splitlines()]
    assert [(c["system"], c["pool_pages"], c["seed"]) for c in cells] == [("vanilla", 2048, 0), ("mepic", 2048, 0)]
    for c in cells:
        (p,) = c["probes"]
        assert p["requests"] == 12 and p["sent"] == 12 and p["anatomy"]["samples"] >= 1
        assert p["anatomy"]["peak"]["used_pages"] <= 2048  # both counted in 16-token pages
    assert cells[1]["probes"][0]["counters"]["chunks_compiled"] > 0  # mepic served the workload as chunks
    table = (out / "table.md").read_text()
    assert "python -m eval.gpu.e2e.capacity" in table and "device cpu (dry run)" in table
    assert "| vanilla | 2,048 |" in table and "| mepic | 2,048 |" in table
    assert (out / "capacity.png").is_file() and (out / "anatomy.png").is_file()

    again = subprocess.run([*args, "--resume-from", str(out)], env={**env, "OUT": str(tmp_path / "two")},
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "0 cells to run (2 kept)" in again.stdout and "server ready" not in again.stdout
    assert len((tmp_path / "two" / "capacity-squad" / "invocations.jsonl").read_text().splitlines()) == 2
