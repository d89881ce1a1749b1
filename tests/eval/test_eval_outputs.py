"""Evaluations never overwrite committed results (issue 85.4): a run without --out (every --quick run) writes to
the git-ignored scratch folder eval/results/local/<experiment>/, and eval.reports.headline --write reads only the
committed folders it names, refuses a smoke run's, and says "unchanged" when it writes nothing. No server: each
command runs in a clone of the repository (its HEAD with this checkout's eval/ and .gitignore committed over it),
capacity's servers and probes stubbed, so `git status` in the clone shows what a run would leave in a checkout."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eval.experiments import run as run_experiment  # the eval package is registered by conftest.py
from eval.reports import headline

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/results.md")

# eval.experiments.capacity's main as `python -m eval.experiments.capacity ARGS` runs it, with no server and no
# request: the servers are never started, each probe's figures are made up (a rate up to 3 req/s holds), and the
# prompts are not tokenized. Everything else (the plan, the output folder, the cells, the report) is its own.
STUB_CAPACITY = '''
import sys

from eval.experiments import capacity, capacity_probe


class Server:
    url = "http://stub.invalid"

    def __init__(self, pool):
        self.pool_pages, self.warmed = pool, True  # ready and warmed: nothing asks it anything

    def launch(self):
        pass

    def stop(self):
        pass


def prompts(model, args, seeds):
    return {seed: [(f"request {i}", 100) for i in range(args.requests)] for seed in seeds}


def cpu_servers(model, args, prompt_tokens):
    return lambda system, pool: Server(pool)


def probe(server, pool, texts, rate, seed, args, bar, clients=None):
    ok = clients is not None or rate <= 3
    return capacity_probe.Probe(rate=rate, requests=len(texts), attainment=1.0 if ok else 0.5, queue_first=0.0,
                          queue_last=0.0, ok=ok, ttft_p50=0.1, e2e_p50=0.5, e2e_mean=0.5, achieved_rps=rate,
                          in_flight=1.0, peak_kv_pages=pool / 2, mean_kv_pages=pool / 4, seconds=1.0, sent=len(texts))


capacity.prompts, capacity.cpu_servers, capacity.probe = prompts, cpu_servers, probe
capacity.main(sys.argv[1:])
'''


def git(*args, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def status(repo: Path) -> str:
    return git("status", "--porcelain", cwd=repo)


@pytest.fixture
def clone(tmp_path) -> Path:
    """A clone of this repository: its HEAD, with this checkout's eval/ and .gitignore (the code under test,
    committed or not) committed over it; `git status` clean."""
    repo = tmp_path / "clone"
    git("clone", "-q", str(ROOT), str(repo), cwd=tmp_path)
    changed = git("diff", "--name-only", "-z", "HEAD", "--", "eval", ".gitignore", cwd=ROOT).split("\0")
    untracked = git("ls-files", "-o", "--exclude-standard", "-z", "--", "eval", cwd=ROOT).split("\0")
    for name in filter(None, changed + untracked):
        source, target = ROOT / name, repo / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
        else:
            target.unlink(missing_ok=True)
    git("add", "-A", cwd=repo)
    git("-c", "user.name=test", "-c", "user.email=test@example.invalid", "-c", "commit.gpgsign=false",
        "commit", "-q", "--allow-empty", "-m", "this checkout's eval/", cwd=repo)
    # --quick's model (models/ is git-ignored): the stubbed run reads only that its config exists.
    (repo / "models" / "tiny").mkdir(parents=True)
    (repo / "models" / "tiny" / "config.json").write_text("{}")
    assert status(repo) == ""
    return repo


def python(repo: Path, *args) -> subprocess.CompletedProcess:
    """`python ARGS` in the clone, importing the clone's eval/."""
    env = {**os.environ, "PYTHONPATH": str(repo), "MPLBACKEND": "Agg"}
    return subprocess.run([sys.executable, *map(str, args)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=300)


def capacity(repo: Path, *args) -> subprocess.CompletedProcess:
    script = repo.parent / "stub_capacity.py"
    script.write_text(STUB_CAPACITY)
    done = python(repo, script, *args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def write_headline(repo: Path) -> subprocess.CompletedProcess:
    return python(repo, "-m", "eval.reports.headline", "--write")


def snapshot(repo: Path) -> dict:
    """The README's and docs/results.md's bytes and modification times."""
    return {name: ((repo / name).read_bytes(), (repo / name).stat().st_mtime_ns) for name in DOCS}


# ---------------------------------------------------------------------------------------------
# A run without --out writes to its scratch folder

def test_capacity_quick_leaves_git_status_clean(clone):
    done = capacity(clone, "--quick")
    assert status(clone) == "", f"capacity --quick changed the checkout:\n{status(clone)}"
    scratch = clone / "eval" / "results" / "local" / "capacity"
    assert {"results.json", "table.md", "cells.jsonl", "capacity.png"} <= {p.name for p in scratch.iterdir()}
    assert json.loads((scratch / "results.json").read_text())["args"]["quick"] == "True"
    assert "eval/results/local/capacity/table.md" in done.stdout


def test_run_without_out_plans_its_scratch_folder():
    def planned(*argv):
        return run_experiment.plan(run_experiment.parser().parse_args(list(argv))).out

    assert planned("--quick") == Path("eval/results/local/squad-quick")
    assert planned("--paper", "--dataset", "hotpotqa") == Path("eval/results/local/hotpotqa-paper")
    assert planned("--quick", "--out", "eval/results/squad-quick") == Path("eval/results/squad-quick")


def test_out_dir_is_the_shared_rule():
    from eval.lib import outputs

    assert outputs.out_dir(None, "load") == Path("eval/results/local/load")
    assert outputs.out_dir("eval/results/load", "load") == Path("eval/results/load")
    assert outputs.is_scratch("eval/results/local/capacity/results.json")
    assert outputs.is_scratch(ROOT / "eval" / "results" / "local")
    assert not outputs.is_scratch("eval/results/capacity/results.json")
    assert not outputs.is_scratch(ROOT / "eval" / "results" / "localhost")


# ---------------------------------------------------------------------------------------------
# eval.reports.headline --write

def test_headline_write_on_unchanged_results_says_unchanged_and_writes_nothing(clone):
    write_headline(clone)  # the committed blocks are in step with the committed results; if not, now they are
    before = snapshot(clone)
    done = write_headline(clone)
    assert done.returncode == 0, done.stderr
    assert "[headline] README.md and docs/results.md unchanged" in done.stdout
    assert "updated" not in done.stdout.splitlines()[-1]
    assert snapshot(clone) == before  # byte-identical, and not rewritten
    assert status(clone) == ""


def test_headline_write_names_the_file_it_changed(clone):
    readme = clone / "README.md"
    committed = readme.read_text()
    begin = committed.index("<!-- headline:begin")
    readme.write_text(committed[:begin] + committed[begin:].replace("| claim |", "| stale claim |", 1))
    docs = snapshot(clone)["docs/results.md"]
    done = write_headline(clone)
    assert done.returncode == 0, done.stderr
    assert "[headline] README.md updated; docs/results.md unchanged" in done.stdout
    assert readme.read_text() == committed
    assert snapshot(clone)["docs/results.md"] == docs


def make_capacity_a_smoke_run(repo: Path) -> str:
    """eval/results/capacity replaced by a --quick run (an explicit --out is where a run writes)."""
    capacity(repo, "--quick", "--out", "eval/results/capacity")
    assert " M eval/results/capacity/results.json" in status(repo).splitlines()
    return "eval/results/capacity/results.json"


def make_a_run_source_a_smoke_run(repo: Path) -> str:
    """A committed eval.experiments.run folder the headline reads, as a --quick run would have recorded it."""
    name = "eval/results/compile-rows/smol-squad-after/results.json"
    results = json.loads((repo / name).read_text())
    results["command"] = "python -m eval.experiments.run --quick --out eval/results/compile-rows/smol-squad-after"
    (repo / name).write_text(json.dumps(results, indent=2))
    return name


@pytest.mark.parametrize("smoke", [make_capacity_a_smoke_run, make_a_run_source_a_smoke_run],
                         ids=["capacity", "run"])
def test_headline_refuses_a_quick_runs_folder(clone, smoke):
    before = snapshot(clone)
    source = smoke(clone)
    done = write_headline(clone)
    assert done.returncode != 0, done.stdout[-2000:]
    assert f"{source} is a smoke run" in done.stderr and "nothing written" in done.stderr
    assert snapshot(clone) == before  # the README and docs/results.md keep the committed figures


def test_headline_reads_only_committed_folders():
    from eval.lib import outputs

    paths = headline.sources()
    assert headline.CAPACITY in paths and headline.TINY_BASE in paths
    assert all(p.is_relative_to(headline.RESULTS) and not outputs.is_scratch(p) for p in paths)
    headline.refuse_uncommitted_sources(paths)
    for bad in (headline.RESULTS / "local" / "capacity" / "results.json", Path("/tmp/capacity/results.json")):
        with pytest.raises(SystemExit, match="scratch folder"):
            headline.refuse_uncommitted_sources([bad])


def test_quick_run_reads_what_the_result_files_record():
    """The committed sources are full runs; the committed smoke run of eval.experiments.run is recognised."""
    from eval.lib import outputs

    assert [p for p in headline.sources() if p.is_file() and outputs.quick_run(json.loads(p.read_text()))] == []
    squad_quick = json.loads((ROOT / "eval" / "results" / "squad-quick" / "results.json").read_text())
    assert outputs.quick_run(squad_quick)
    assert outputs.quick_run({"args": {"quick": "True"}, "invocations": []})
    assert outputs.quick_run({"invocations": [{"argv": ["--quick", "--out", "x"]}]})
    assert outputs.quick_run({"kind": "quick"})
    assert not outputs.quick_run({"command": "python -m eval.experiments.run --paper --out 'a b"})
