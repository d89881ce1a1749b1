"""Every command the README and docs/*.md name runs, once, at its smallest size.

The docs are parsed for commands (`python -m eval.…`, `python -m sglang_mepic.…`, `python eval/….py`
anywhere; `make TARGET` in code) and each must have an entry in SMOKE, the registry of the test
that runs it; a command named in the docs without one fails `test_every_command_the_docs_name_has_
a_smoke_test`. Each entry names a test that runs the command and checks its output, not only its
exit status; the test must name the command, or the entry fails too.

The commands that need a server share one: `python -m sglang_mepic.launch_cluster --instances 1`
(which is itself smoke-tested that way, and starts its instance with `python -m
sglang_mepic.launch_server`), and each eval command is pointed at its instance with `--url`
(eval/served.py). They run in this process (`runpy`, as `python -m` runs them: the `__main__` block,
argparse and all), which saves an interpreter and SGLang's imports per command. `make` targets are
resolved with `make -n`: `make serve` serves until stopped and `make test` is the suite itself.
"""

import ast
import json
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# ---------------------------------------------------------------------------------------------
# The commands the docs name

PYTHON = re.compile(r"\bpython[\d.]*\s+(?:-m\s+((?:eval|sglang_mepic)(?:\.\w+)+)|(eval/[\w/]+\.py))")
MAKE = re.compile(r"(?:^|[\s`(;&|])make\s+([a-z][\w-]*)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)


def code_of(text: str) -> list[str]:
    """The code in a Markdown text: fenced blocks, lines indented 4 spaces or more, inline spans."""
    fenced = FENCE.findall(text)
    prose = FENCE.sub("", text)
    indented = [line for line in prose.splitlines() if re.match(r"^(?: {4,}|\t)\S", line)]
    return fenced + indented + [m.group(2) for m in INLINE.finditer(prose)]


def commands_in(text: str) -> set[str]:
    """The commands a Markdown text names: python commands anywhere (they cannot be prose), make targets
    only in code (`make sure` is English)."""
    found = {f"python -m {m[0]}" if m[0] else f"python {m[1]}" for m in PYTHON.findall(text)}
    found |= {f"make {target}" for code in code_of(text) for target in MAKE.findall(code)}
    return found


def documented(paths=DOCS) -> dict[str, list[str]]:
    """Each command the docs name, with the files that name it."""
    named: dict[str, list[str]] = {}
    for path in paths:
        for command in commands_in(path.read_text()):
            named.setdefault(command, []).append(str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path))
    return named


def missing(named: dict[str, list[str]], registry: dict) -> dict[str, list[str]]:
    return {command: where for command, where in named.items() if command not in registry}


# ---------------------------------------------------------------------------------------------
# The registry: each documented command and the test that runs it

HERE = "tests/test_commands.py"
SMOKE = {
    "make serve": f"{HERE}::test_make_targets_resolve",
    "make test": f"{HERE}::test_make_targets_resolve",
    "make test-fast": f"{HERE}::test_make_targets_resolve",
    "make venv": f"{HERE}::test_make_targets_resolve",
    "make models": f"{HERE}::test_make_targets_resolve",
    "python -m sglang_mepic.launch_cluster": f"{HERE}::test_launch_cluster_serves_through_its_router",
    "python -m sglang_mepic.launch_server": f"{HERE}::test_launch_server_started_the_instance",
    "python -m sglang_mepic.models": f"{HERE}::test_models_builds_the_tiny_model",
    "python -m sglang_mepic.launch.flags_doc": f"{HERE}::test_flags_doc_check",
    "python -m eval.run": f"{HERE}::test_eval_run",
    "python -m eval.load": f"{HERE}::test_eval_load",
    "python -m eval.overload": f"{HERE}::test_eval_overload",
    "python -m eval.fidelity": f"{HERE}::test_eval_fidelity",
    "python -m eval.agent": f"{HERE}::test_eval_agent",
    "python -m eval.bench_pool": f"{HERE}::test_eval_bench_pool",
    "python -m eval.forward_cost": f"{HERE}::test_eval_forward_cost",
    "python -m eval.known_reuse": f"{HERE}::test_eval_known_reuse",
    "python -m eval.bench_cache": f"{HERE}::test_eval_bench_cache",
    "python -m eval.known_lookup": f"{HERE}::test_eval_known_lookup",
    "python -m eval.build_calibration": f"{HERE}::test_eval_build_calibration",
    "python -m eval.headline": f"{HERE}::test_eval_headline",
    # Run by tests of their own (each starts what the command needs, or the command is their subject):
    "python -m eval.capacity": "tests/test_eval_capacity.py::test_quick_runs_end_to_end",
    "python -m eval.compare": "tests/test_eval_checkpoint.py::test_the_readers_read_a_packed_folder",
    "python -m eval.checkpoint": "tests/test_eval_checkpoint.py::test_the_pack_command_packs_folders_and_says_which_were_packed",
    "python -m sglang_mepic.check_model": "tests/test_check_model.py::test_tiny_random_model_fails",
    "python -m sglang_mepic.launch.warm":
        "tests/test_known_texts_server.py::test_the_warm_command_registers_a_folder_and_a_jsonl_file",
    "python -m sglang_mepic.kernels.aot": "tests/test_kernels.py::test_compiles_for_sm90_and_sm80",
    "python eval/bench_attention.py": "tests/test_eval_bench.py::test_cpu_attention_bench_runs_and_checks_itself",
}


def check_every_command_has_a_smoke_test(named: dict[str, list[str]]) -> None:
    gaps = missing(named, SMOKE)
    assert not gaps, ("commands the docs name that no test runs (add a smoke test and its SMOKE entry in "
                      f"{HERE}):\n" + "\n".join(f"  {c}  (named in {', '.join(w)})" for c, w in sorted(gaps.items())))


def test_every_command_the_docs_name_has_a_smoke_test():
    check_every_command_has_a_smoke_test(documented())


def test_every_smoke_entry_names_a_test_that_runs_its_command():
    named = documented()
    for command, node in SMOKE.items():
        assert command in named, f"{command}: no doc names it any more; drop its SMOKE entry"
        path, name = node.split("::")
        tree = ast.parse((ROOT / path).read_text())
        functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert name in functions, f"{command}: {node} does not exist"
        f = functions[name]
        lines = (ROOT / path).read_text().splitlines()[min([d.lineno for d in f.decorator_list] + [f.lineno]) - 1:f.end_lineno]
        token = command.split()[-1].removesuffix(".py").replace("/", ".").split(".")[-1]  # eval.run -> run
        assert re.search(rf"\b{re.escape(token)}\b", "\n".join(lines)), f"{command}: {node} does not name {token}"


def test_a_planted_command_without_a_smoke_test_fails_the_check(tmp_path):
    doc = tmp_path / "planted.md"
    doc.write_text("Run `python -m eval.brand_new --fast`, then\n\n    .venv/bin/python -m sglang_mepic.brand_new\n"
                   "    make brand-new\n\n```\nmake another-one ARGS=1\n```\n\nMake sure to make tea; `make "
                   "serve` as before; python -m sglang_router.launch_router is not ours.\n")
    assert commands_in(doc.read_text()) == {"python -m eval.brand_new", "python -m sglang_mepic.brand_new",
                                            "make brand-new", "make another-one", "make serve"}
    with pytest.raises(AssertionError) as failed:
        check_every_command_has_a_smoke_test(documented([*DOCS, doc]))
    reported = re.findall(r"^\s+(\S.*?)  \(named in (.+)\)$", str(failed.value), re.M)
    assert reported == [(c, str(doc)) for c in sorted(["python -m eval.brand_new", "python -m sglang_mepic.brand_new",
                                                       "make brand-new", "make another-one"])]


def test_every_eval_module_is_named_by_a_test():
    # Not only the documented commands: each module under eval/ (not eval/gpu/) is used or run by some test.
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").glob("test_*.py"))
    unnamed = [p.stem for p in sorted((ROOT / "eval").glob("*.py")) if p.stem != "__init__"
               and not re.search(rf"eval[./]{p.stem}\b|from eval import [\w, ]*\b{p.stem}\b", tests)]
    assert not unnamed, f"eval modules no test names: {unnamed}"


# ---------------------------------------------------------------------------------------------
# Running a command

def command(capsys, module: str, *args) -> str:
    """`python -m module args` in this process; it must end with status 0. Its stdout (stderr is shown on failure)."""
    argv = sys.argv
    sys.argv = [module, *map(str, args)]
    started = time.monotonic()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: "found in sys.modules after import of package"
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:
        if e.code not in (None, 0):
            out, err = capsys.readouterr()
            pytest.fail(f"{module} exited with {e.code!r}\n{out[-3000:]}\n{err[-3000:]}")
    finally:
        sys.argv = argv
    out, err = capsys.readouterr()
    print(f"[smoke] python -m {module}: {time.monotonic() - started:.1f} s")  # shown with -rP
    return out


def table_rows(text: str, first: str) -> list[list[str]]:
    """The cells of the Markdown table rows of `text` whose first cell is `first`."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("|")]
    return [r for r in rows if r[0] == first]


# ---------------------------------------------------------------------------------------------
# No server

@pytest.mark.parametrize("target, recipe", [
    ("serve", "-m sglang_mepic.launch_server --model-path models/smollm2-135m --host 127.0.0.1 --port 30000"),
    ("test", "/bin/pytest"), ("test-fast", '-m "not server and not slow"'), ("venv", "scripts/setup_venv.sh"),
    ("models", "-m sglang_mepic.models smollm2-135m"),
])
def test_make_targets_resolve(target, recipe):
    # `make -n -B`: what the target would run, all of it, without running it (serve serves until stopped,
    # test is this suite).
    done = subprocess.run(["make", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert recipe in done.stdout, done.stdout


def test_eval_bench_cache(capsys):
    out = command(capsys, "eval.bench_cache", "--sizes", "100", "--calls", "2")
    (row,) = [line for line in out.splitlines() if re.match(r"\| \d", line)]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[0].replace(",", "")) >= 100 and len(cells) == 7  # cached pages, then six timings
    assert all(float(x) >= 0 for c in cells[1:] for x in c.split(" / "))


def test_eval_bench_prefetch(capsys, tiny_model):
    out = command(capsys, "eval.bench_prefetch", "--model", tiny_model, "--chunks", "2", "--chunk-pages", "1,2",
                  "--reps", "2")
    for name in ("sync fetch+place", "want (round 1)", "want+take+place (ready)", "background wait"):
        (row,) = table_rows(out, name)
        assert len(row) == 3 and all(float(c) >= 0 for c in row[1:]), row


def test_eval_known_lookup(capsys):
    out = command(capsys, "eval.known_lookup", "--docs", "30", "--repeat", "2", "--sizes", "200,400")
    assert "[known_lookup] 30 documents registered" in out
    rows = [r for r in (line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| [\d,]+ \|", line))]
    assert len(rows) == 2 and sum(int(r[2]) for r in rows) > 0  # registered documents found in the prompts


def test_eval_build_calibration(capsys, tmp_path):
    out = command(capsys, "eval.build_calibration", "--questions", "2", "--chunks", "2", "--out", tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    assert len(data["questions"]) == 2 and all(len(q["chunks"]) == 2 for q in data["questions"])
    assert data["built_by"] == "python -m eval.build_calibration --questions 2 --chunks 2 --seed 33"
    assert f"{len(data['paragraphs'])} paragraphs" in out


def test_eval_headline(capsys):
    # Printed, not --write: the README's block is checked in test_eval_headline.py.
    out = command(capsys, "eval.headline")
    assert "| figure | median | range | runs | target | source |" in out and "Sources:" in out
    assert "| dataset | system | latency s (ours) |" in out


def test_flags_doc_check(capsys):
    command(capsys, "sglang_mepic.launch.flags_doc", "--check")  # exit 0: docs/flags.md is the table SETTINGS gives


def test_models_builds_the_tiny_model(capsys, tmp_path):
    out = command(capsys, "sglang_mepic.models", "tiny", "--out", tmp_path / "tiny")
    assert out.strip() == str(tmp_path / "tiny")
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["model_type"] == "llama"
    assert (tmp_path / "tiny" / "model.safetensors").stat().st_size > 1_000_000


# ---------------------------------------------------------------------------------------------
# One server for the rest: launch_cluster's one instance

SHARED = ["--dtype", "float32", "--max-total-tokens", str(512 * 16), "--decode-log-interval", "4",
          # eval.load's server (evicted chunks go to the host tier); eval.run's systems have one too
          "--mepic-host-tier-gb", "0.25",
          # eval.agent's mepic system and eval.known_reuse's server chunk unmarked prompts
          "--mepic-auto-chunk", "messages+known"]


def _die_with_parent() -> None:
    from sglang_mepic.process.server_process import _die_with_parent as die
    die()


@pytest.fixture(scope="module")
def cluster(tiny_model):
    from sglang_mepic.process.server_process import free_port

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


@pytest.mark.server
def test_launch_cluster_serves_through_its_router(cluster):
    # The `cluster` fixture started `python -m sglang_mepic.launch_cluster` and read its ready line.
    assert "[cluster] starting 1 instance(s), storage none ..." in cluster.lines[0]
    r = requests.post(cluster.router + "/generate", timeout=120, json={
        "text": "Answer.\n<|chunk|>" + "The tower stands in Paris. " * 8 + "<|/chunk|>\nWhere is it?",
        "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert r.status_code == 200, r.text
    assert len(r.json()["meta_info"]["mepic_chunks"]) == 1  # the instance's answer, through the router


@pytest.mark.server
def test_launch_server_started_the_instance(cluster):
    # launch_cluster starts each instance with `python -m sglang_mepic.launch_server`.
    log = cluster.log.read_text()
    assert "The server is fired up and ready to roll!" in log
    assert re.search(r"sglang-mepic: .*--mepic-auto-chunk messages\+known", log), log[-3000:]


@pytest.mark.server
def test_eval_run(cluster, tiny_model, tmp_path, capsys):
    args = ["--url", cluster.url, "--model", tiny_model, "--systems", "mepic", "--requests", "6", "--qps", "4",
            "--chunks", "3", "--new-tokens", "4", "--reuse", "0.8", "--out", tmp_path]
    out = command(capsys, "eval.run", *args)
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
    again = command(capsys, "eval.run", *[a for a in args if a not in ("--url", cluster.url)], "--resume",
                    "--no-plots")
    assert "[resume] 1 of 1 (system, point, seed) runs kept" in again
    resumed = json.loads((tmp_path / "results.json").read_text())
    assert resumed["rows"] == [row] and resumed["invocations"] == 2


@pytest.mark.server
def test_eval_load(cluster, tiny_model, tmp_path, capsys):
    # One run, on the shared server (its pool of 512 pages is smaller than the 40 chunks' KV, and it has a
    # host tier): eval.load --compare's second server, without the host tier, is what --url leaves out.
    out = command(capsys, "eval.load", "--url", cluster.url, "--model", tiny_model, "--requests", "60",
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


@pytest.mark.server
def test_eval_overload(cluster, tiny_model, capsys):
    out = command(capsys, "eval.overload", "--url", cluster.url, "--model", tiny_model, "--systems", "mepic",
                  "--requests", "4", "--qps", "8", "--chunks", "2")
    assert "[overload] hotpotqa, 4 requests x 2 chunks" in out
    (line,) = [x for x in out.splitlines() if x.startswith("mepic: ")]
    assert re.match(r"mepic: 4 requests in [\d.]+ s; TTFT p50 [\d.]+ s, e2e p50 [\d.]+ s; queue p50", line), line
    assert "the server's log not read (--url" in line


@pytest.mark.server
def test_eval_fidelity(cluster, tiny_model, tmp_path, capsys):
    out = command(capsys, "eval.fidelity", "--url", cluster.url, "--model", tiny_model, "--modes", "mepic",
                  "--questions", "2", "--chunks", "2", "--new-tokens", "2", "--prompt", "raw",
                  "--json", tmp_path / "f.json")
    (full,), (mepic,) = table_rows(out, "full"), table_rows(out, "mepic")
    assert full[1:3] == ["1.000", "1.000"]  # full against itself
    assert 0 <= float(mepic[1]) <= 1 and float(mepic[7].split(" / ")[1]) > 0  # prompt tokens
    assert set(json.loads((tmp_path / "f.json").read_text())["results"]) == {"full", "mepic"}


@pytest.mark.server
def test_eval_agent(cluster, tiny_model, tmp_path, capsys):
    out = command(capsys, "eval.agent", "--url", cluster.url, "--model", tiny_model, "--conversations", "1",
                  "--turns", "2", "--files", "2", "--results", "2", "--new-tokens", "2", "--out", tmp_path)
    rows = {r[0]: r for r in (line.split("|")[1:-1] for line in out.splitlines()) if r}
    assert {"vanilla", "mepic", "full"} <= {k.strip() for k in rows}
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["requests"] for r in results["rows"]] == [2, 2, 2]
    assert results["command"].startswith("python -m eval.agent --url")
    assert f"every system on the server at {cluster.url}" in (tmp_path / "table.md").read_text()


@pytest.mark.server
def test_eval_bench_pool(cluster, capsys):
    out = command(capsys, "eval.bench_pool", "--url", cluster.url, "--requests", "2", "--fill-pages", "40",
                  "--fill-tokens", "96")
    (empty,), (filled,) = table_rows(out, "empty"), table_rows(out, "filled")
    assert int(filled[1].replace(",", "")) >= 40 and float(empty[2]) > 0 and float(filled[2]) > 0
    assert re.search(r"filled / empty, mean decode step: \d+\.\d{3}", out)


@pytest.mark.server
def test_eval_forward_cost(cluster, tiny_model, capsys):
    out = command(capsys, "eval.forward_cost", "--url", cluster.url, "--model", tiny_model, "--systems", "mepic",
                  "--tokens", "16,48", "--repeats", "1")
    (row,) = table_rows(out, "mepic")
    assert len(row) == 5 and all(float(c) > 0 for c in row[1:3])  # a forward time per length, then the fit


@pytest.mark.server
def test_eval_known_reuse(cluster, tiny_model, tmp_path, capsys):
    # Last of the commands on the shared server: it registers texts there (found in later plain prompts).
    out = command(capsys, "eval.known_reuse", "--url", cluster.url, "--model", tiny_model, "--requests", "4",
                  "--chunks", "2", "--reuse", "0.5", "--max-new-tokens", "2", "--out", tmp_path)
    (row,) = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert row["requests"] == 4 and row["reused_tokens_marked"] > 0
    assert row["reused_tokens_unmarked"] > 0 and row["chunks_unmarked"] > 0  # found by content, not markup
    assert "median unmarked / marked" in out


@pytest.mark.server
def test_launch_cluster_stops_on_ctrl_c(cluster):
    cluster.proc.send_signal(signal.SIGINT)
    assert cluster.proc.wait(90) == 0, "".join(cluster.lines)
    assert any(line.startswith("[cluster] stopping") for line in cluster.lines)
    with pytest.raises(requests.ConnectionError):
        requests.get(cluster.url + "/health", timeout=5)
