"""Every command the README and docs/*.md name runs, once, at its smallest size.

The docs are parsed for commands (`python -m eval.…`, `python -m sglang_mepic.…`, `python eval/….py`
anywhere; `make TARGET` in code) and each must have an entry in SMOKE, the registry of the test
that runs it; a command named in the docs without one fails `test_every_command_the_docs_name_has_
a_smoke_test`. Each entry names a test that runs the command and checks its output, not only its
exit status; the test must name the command, or the entry fails too.

The commands that need a server share one: `python -m sglang_mepic.launch_cluster --instances 1`
(which is itself smoke-tested that way, and starts its instance with `python -m
sglang_mepic.launch_server`), and each eval command is pointed at its instance with `--url`
(eval/lib/served.py). They run in this process (`runpy`, as `python -m` runs them: the `__main__` block,
argparse and all), which saves an interpreter and SGLang's imports per command. `make` targets are
resolved with `make -n`: `make serve` serves until stopped and `make test` is the suite itself.
"""

import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests
from support.commands import ROOT, command, table_rows


# ---------------------------------------------------------------------------------------------
# One server for the rest: launch_cluster's one instance

SHARED = ["--dtype", "float32", "--max-total-tokens", str(512 * 16), "--decode-log-interval", "4",
          # eval.experiments.load's server (evicted chunks go to the host tier); eval.experiments.run's systems have one too
          "--mepic-host-tier-gb", "0.25",
          # eval.experiments.agent's mepic system and eval.experiments.known_reuse's server chunk unmarked prompts
          "--mepic-auto-chunk", "messages+known"]


def _die_with_parent() -> None:
    from sglang_mepic.process.server_process import die_with_parent as die
    die()
    # As a terminal's foreground job has it: a suite started in the background (`make test &`) hands on
    # SIGINT ignored, and Python then never raises KeyboardInterrupt (launch_cluster outlived its 90 s).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def cluster(tiny_model, servers):
    from sglang_mepic.process.server_process import free_port

    servers.stop_all()  # a host tier: SGLang wants 10 GB of RAM free beyond it
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.Popen([sys.executable, "-m", "sglang_mepic.launch_cluster", "--instances", "1", "--storage",
                             "none", "--port", str(free_port()), "--model-path", tiny_model, *SHARED],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_die_with_parent)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    started, deadline = time.monotonic(), time.monotonic() + 600
    while not any(line.startswith("[cluster] ready in") for line in lines):
        assert proc.poll() is None, "launch_cluster exited:\n" + "".join(lines)
        assert time.monotonic() < deadline, "launch_cluster not ready in 600 s:\n" + "".join(lines)
        time.sleep(0.5)
    time.sleep(0.5)  # the describe lines follow the ready line
    text = "".join(lines)
    router = re.search(r"^router (http://\S+) \((\w+)\), log (\S+)$", text, re.M)
    instance = re.search(r"^instance 0: (http://\S+), log (\S+)$", text, re.M)
    assert router and instance, text
    print(f"[smoke] launch_cluster ready in {time.monotonic() - started:.0f} s")
    yield SimpleNamespace(proc=proc, lines=lines, router=router[1], url=instance[1], log=Path(instance[2]))
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_launch_cluster_serves_through_its_router(cluster):
    # The `cluster` fixture started `python -m sglang_mepic.launch_cluster` and read its ready line.
    assert "[cluster] starting 1 instance(s), storage none ..." in cluster.lines[0]
    r = requests.post(cluster.router + "/generate", timeout=120, json={
        "text": "Answer.\n<|chunk|>" + "The tower stands in Paris. " * 8 + "<|/chunk|>\nWhere is it?",
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert len(r.json()["meta_info"]["mepic_chunks"]) == 1  # the instance's answer, through the router


def test_launch_server_started_the_instance(cluster):
    # launch_cluster starts each instance with `python -m sglang_mepic.launch_server`.
    log = cluster.log.read_text()
    assert "The server is fired up and ready to roll!" in log
    assert re.search(r"sglang-mepic: .*--mepic-auto-chunk messages\+known", log), log[-3000:]


def test_eval_run(cluster, tiny_model, tmp_path, capsys):
    args = ["--url", cluster.url, "--model", tiny_model, "--systems", "mepic", "--requests", "6", "--qps", "4",
            "--chunks", "3", "--new-tokens", "4", "--reuse", "0.8", "--out", tmp_path]
    out = command(capsys, "eval.experiments.run", *args)
    assert "reuse ratio" in out and "mean prompt" in out
    lines = (tmp_path / "table.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("| system"))
    assert [c.strip() for c in header.strip("|").split("|")] == RUN_COLUMNS
    (body,) = [line.split("|")[1:-1] for line in lines if line.startswith("| mepic")]
    assert [c.strip() for c in body[-2:]] == ["—", "—"]  # no `full` ran to compare with
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["requests"] == 6 and 0 < row["reuse_ratio"] < 1
    assert row["pool_pages"] == 512 and "a KV pool of 512 pages" in lines[0]  # as the server reported it
    assert f"Every system ran on the server at {cluster.url} (--url)" in lines[0]
    for key in ("peak_kv_pages", "ttft_p50", "e2e_p50", "throughput_rps", "recomputed_tokens", "prompt_tokens"):
        assert row[key] > 0, key
    assert 0 < row["compiling_share"] <= 1  # the first requests computed their chunks in their own batches
    assert row["agreement"] is None and row["top1"] is None
    assert row["recomputed_tokens"] < row["prompt_tokens"] / 2  # the chunks' reuse shows
    for name in ("peak_kv_vs_qps.png", "peak_kv_vs_chunks.png", "ttft_p50_vs_qps.png"):
        assert (tmp_path / name).stat().st_size > 1000
    # Every finished point was saved as it ended: --resume rebuilds the table without a server.
    again = command(capsys, "eval.experiments.run", *[a for a in args if a not in ("--url", cluster.url)], "--resume",
                    "--no-plots")
    assert "[resume] 1 of 1 (system, point, seed) runs kept" in again
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["rows"] == [row] and resumed["invocations"] == 2


def test_eval_load(cluster, tiny_model, tmp_path, capsys):
    # One run, on the shared server (its pool of 512 pages is smaller than the 40 chunks' KV, and it has a
    # host tier): eval.experiments.load --compare's second server, without the host tier, is what --url leaves out.
    out = command(capsys, "eval.experiments.load", "--url", cluster.url, "--model", tiny_model, "--requests", "60",
                  "--clients", "8", "--chunk-pool", "40", "--out", tmp_path)
    (r,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert r["label"] == f"the server at {cluster.url}"
    assert r["ok"] + r["aborted"] == 60 and r["failed"] == 0 and r["server_answers_after"]
    assert r["free_pages_after_flush"] == r["free_pages_start"] == r["end"]["kv_pages_total"]
    assert r["end"]["chunk_evictions"] > 0  # the pool was small enough to evict
    assert r["end"]["tier_lookups_host"] > 0  # and evicted chunks came back from the host tier
    assert "| compiled tokens |" in out and (tmp_path / "load.png").stat().st_size > 1000


RUN_COLUMNS = ["system", "QPS", "chunks", "reuse", "runs", "peak KV pages", "p95 KV pages", "mean KV pages",
               "peak occupied pages", "capped", "peak KV MiB", "TTFT p50 s", "TTFT p99 s", "TTFT p50 chunks stored s",
               "TTFT p50 compiling s", "compiling", "tokenize p50 s", "queue p50 s", "forward p50 s", "e2e p50 s",
               "e2e p99 s", "req/s", "recomputed tok/req", "compiled tok/req", "prompt tok/req", "compiles",
               "chunk evictions", "host loads", "copy fallbacks", "F1", "EM", "gold contained", "agreement vs full",
               "top-1 vs full"]


def test_eval_overload(cluster, tiny_model, capsys):
    out = command(capsys, "eval.experiments.overload", "--url", cluster.url, "--model", tiny_model, "--systems", "mepic",
                  "--requests", "4", "--qps", "8", "--chunks", "2")
    assert "[overload] hotpotqa, 4 requests x 2 chunks" in out
    (line,) = [x for x in out.splitlines() if x.startswith("mepic: ")]
    assert re.match(r"mepic: 4 requests in [\d.]+ s; TTFT p50 [\d.]+ s, e2e p50 [\d.]+ s; queue p50", line), line
    assert "the server's log not read (--url" in line


def test_eval_fidelity(cluster, tiny_model, tmp_path, capsys):
    out = command(capsys, "eval.experiments.fidelity", "--url", cluster.url, "--model", tiny_model, "--modes", "mepic",
                  "--questions", "2", "--chunks", "2", "--new-tokens", "2", "--prompt", "raw",
                  "--json", tmp_path / "f.json")
    (full,), (mepic,) = table_rows(out, "full"), table_rows(out, "mepic")
    assert full[1:3] == ["1.000", "1.000"]  # full against itself
    assert 0 <= float(mepic[1]) <= 1 and float(mepic[7].split(" / ")[1]) > 0  # prompt tokens
    assert set(json.loads((tmp_path / "f.json").read_text())["results"]) == {"full", "mepic"}


def test_eval_agent(cluster, tiny_model, tmp_path, capsys):
    out = command(capsys, "eval.experiments.agent", "--url", cluster.url, "--model", tiny_model, "--conversations", "1",
                  "--turns", "2", "--files", "2", "--results", "2", "--new-tokens", "2", "--out", tmp_path)
    rows = {r[0]: r for r in (line.split("|")[1:-1] for line in out.splitlines()) if r}
    assert {"vanilla", "mepic", "full"} <= {k.strip() for k in rows}
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["requests"] for r in results["rows"]] == [2, 2, 2]
    assert results["command"].startswith("python -m eval.experiments.agent --url")
    assert f"every system on the server at {cluster.url}" in (tmp_path / "table.md").read_text()


def test_eval_bench_pool(cluster, capsys):
    out = command(capsys, "eval.bench.pool", "--url", cluster.url, "--requests", "2", "--fill-pages", "40",
                  "--fill-tokens", "96")
    (empty,), (filled,) = table_rows(out, "empty"), table_rows(out, "filled")
    assert int(filled[1].replace(",", "")) >= 40 and float(empty[2]) > 0 and float(filled[2]) > 0
    assert re.search(r"filled / empty, mean decode step: \d+\.\d{3}", out)


def test_eval_forward_cost(cluster, tiny_model, capsys):
    out = command(capsys, "eval.bench.forward_cost", "--url", cluster.url, "--model", tiny_model, "--systems", "mepic",
                  "--tokens", "16,48", "--repeats", "1")
    (row,) = table_rows(out, "mepic")
    assert len(row) == 5 and all(float(c) > 0 for c in row[1:3])  # a forward time per length, then the fit


def test_eval_bench_step(cluster, tiny_model, capsys):
    out = command(capsys, "eval.bench.step", "--url", cluster.url, "--model", tiny_model, "--systems", "mepic",
                  "--batches", "2", "--short", "2", "--long", "20", "--rounds", "1")
    (row,) = table_rows(out, "mepic")
    assert row[1] == "2" and float(row[2]) >= 15  # the batch; 18 decode steps of difference, give or take the ramp
    # The forward a step is large and sure; the rest, a millisecond or so over 18 steps, is within the noise
    # of the two runs' other work on a shared server: a figure, not a sign.
    assert float(row[3]) > 0 and math.isfinite(float(row[4]))
    # the time outside the forward, stage by stage: where a difference between systems sits
    (stage,) = table_rows(out, "process_batch_result")
    assert len(stage) == 2 and math.isfinite(float(stage[1]))


def test_eval_known_reuse(cluster, tiny_model, tmp_path, capsys):
    # Last of the commands on the shared server: it registers texts there (found in later plain prompts).
    out = command(capsys, "eval.experiments.known_reuse", "--url", cluster.url, "--model", tiny_model, "--requests", "4",
                  "--chunks", "2", "--reuse", "0.5", "--max-new-tokens", "2", "--out", tmp_path)
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["requests"] == 4 and row["reused_tokens_marked"] > 0
    assert row["reused_tokens_unmarked"] > 0 and row["chunks_unmarked"] > 0  # found by content, not markup
    assert "median unmarked / marked" in out


def test_launch_cluster_stops_on_ctrl_c(cluster):
    cluster.proc.send_signal(signal.SIGINT)
    assert cluster.proc.wait(90) == 0, "".join(cluster.lines)
    assert any(line.startswith("[cluster] stopping") for line in cluster.lines)
    with pytest.raises(requests.ConnectionError):
        requests.get(cluster.url + "/health", timeout=5)
