"""The evaluation harnesses end to end on the tiny model."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["system", "QPS", "chunks", "reuse", "runs", "peak KV pages", "p95 KV pages", "mean KV pages",
           "peak occupied pages", "capped", "peak KV MiB", "TTFT p50 s", "TTFT p99 s", "TTFT p50 chunks stored s",
           "TTFT p50 compiling s", "compiling", "tokenize p50 s",
           "queue p50 s", "forward p50 s", "e2e p50 s", "e2e p99 s",
           "req/s", "recomputed tok/req", "compiled tok/req", "prompt tok/req", "compiles", "chunk evictions", "host loads",
           "copy fallbacks", "F1", "EM", "gold contained", "agreement vs full", "top-1 vs full"]


def test_eval_harness_produces_table_json_and_plots(tiny_model, tmp_path):
    # One system: a server start costs about 80 s of imports on 2 cores, and the test must
    # stay under 2 minutes. Fidelity against `full` is covered where `full` runs (test_link).
    started = time.monotonic()
    # As a user runs it: from the repository root, as a module.
    done = subprocess.run([sys.executable, "-m", "eval.run", "--model", tiny_model, "--systems", "mepic",
                           "--requests", "6", "--qps", "4", "--chunks", "3", "--new-tokens", "4", "--reuse", "0.8",
                           "--pool-pages", "512", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"eval.run took {time.monotonic() - started:.0f} s")
    assert "reuse ratio" in done.stdout and "mean prompt" in done.stdout
    lines = (tmp_path / "table.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| system"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    body = [line.split("|")[1:-1] for line in lines if line.startswith("| mepic")]
    assert len(body) == 1 and [c.strip() for c in body[0][-2:]] == ["—", "—"]  # no `full` ran to compare with
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["requests"] == 6 and 0 < row["reuse_ratio"] < 1
    assert row["pool_pages"] == 512 and "a KV pool of 512 pages" in lines[0]  # as the server reported it
    for key in ("peak_kv_pages", "ttft_p50", "e2e_p50", "throughput_rps", "recomputed_tokens", "prompt_tokens"):
        assert row[key] > 0, key
    # The first requests computed their chunks in their own batches.
    assert 0 < row["compiling_share"] <= 1
    assert row["agreement"] is None and row["top1"] is None
    assert row["recomputed_tokens"] < row["prompt_tokens"] / 2  # the chunks' reuse shows
    for name in ("peak_kv_vs_qps.png", "peak_kv_vs_chunks.png", "ttft_p50_vs_qps.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # Every finished point was saved as it ended: --resume rebuilds the table without a server.
    again = subprocess.run([*done.args, "--resume", "--no-plots"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "[resume] 1 of 1 (system, point, seed) runs kept" in again.stdout and "starting server" not in again.stderr
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["rows"] == [row] and resumed["invocations"] == 2


def test_load_harness_runs_both_ways_and_checks_itself(tiny_model, tmp_path):
    done = subprocess.run([sys.executable, "-m", "eval.load", "--model", tiny_model, "--requests", "60",
                           "--clients", "8", "--chunk-pool", "16", "--compare", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert [r["label"] for r in runs] == ["no host tier", "host tier 0.25 GB"]
    for r in runs:
        assert r["ok"] + r["aborted"] == 60 and r["failed"] == 0
        assert r["free_pages_after_flush"] == r["free_pages_start"] == r["end"]["kv_pages_total"]
        assert r["end"]["chunk_evictions"] > 0  # the pool was small enough to evict
    without, with_host = (r["end"] for r in runs)
    assert with_host["tier_lookups_host"] > 0 and without["tier_lookups_host"] == 0
    assert with_host["compiled_tokens"] < without["compiled_tokens"]
    assert "| compiled tokens |" in (tmp_path / "table.md").read_text()
    assert (tmp_path / "load.png").stat().st_size > 1000
