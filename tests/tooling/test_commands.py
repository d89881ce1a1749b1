"""Every command the README and docs/*.md name runs, once, at its smallest size. The unit half: the whole description, and the tests on a server, are in
e2e/test_commands_server.py."""

import ast
import json
import re
import subprocess

import pytest
from support.commands import ROOT, command, table_rows

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

HERE = "tests/tooling/test_commands.py"
E2E = "tests/tooling/e2e/test_commands_server.py"
SMOKE = {
    "make serve": f"{HERE}::test_make_targets_resolve",
    "make test": f"{HERE}::test_make_targets_resolve",
    "make test-fast": f"{HERE}::test_make_targets_resolve",
    "make venv": f"{HERE}::test_make_targets_resolve",
    "make models": f"{HERE}::test_make_targets_resolve",
    "python -m sglang_mepic.launch_cluster": f"{E2E}::test_launch_cluster_serves_through_its_router",
    "python -m sglang_mepic.launch_server": f"{E2E}::test_launch_server_started_the_instance",
    "python -m sglang_mepic.models": f"{HERE}::test_models_builds_the_tiny_model",
    "python -m sglang_mepic.launch.flags_doc": f"{HERE}::test_flags_doc_check",
    "python -m eval.experiments.run": f"{E2E}::test_eval_run",
    "python -m eval.experiments.load": f"{E2E}::test_eval_load",
    "python -m eval.experiments.overload": f"{E2E}::test_eval_overload",
    "python -m eval.experiments.fidelity": f"{E2E}::test_eval_fidelity",
    "python -m eval.experiments.agent": f"{E2E}::test_eval_agent",
    "python -m eval.bench.pool": f"{E2E}::test_eval_bench_pool",
    "python -m eval.bench.forward_cost": f"{E2E}::test_eval_forward_cost",
    "python -m eval.bench.step": f"{E2E}::test_eval_bench_step",
    "python -m eval.experiments.known_reuse": f"{E2E}::test_eval_known_reuse",
    "python -m eval.bench.cache": f"{HERE}::test_eval_bench_cache",
    "python -m eval.bench.known_lookup": f"{HERE}::test_eval_known_lookup",
    "python -m eval.reports.build_calibration": f"{HERE}::test_eval_build_calibration",
    "python -m eval.reports.headline": f"{HERE}::test_eval_headline",
    # Run by tests of their own (each starts what the command needs, or the command is their subject):
    "python -m eval.experiments.capacity": "tests/tooling/e2e/test_eval_capacity_server.py::test_quick_runs_end_to_end",
    "python -m eval.reports.compare": "tests/tooling/test_eval_checkpoint.py::test_the_readers_read_a_packed_folder",
    "python -m eval.lib.checkpoint": "tests/tooling/test_eval_checkpoint.py::test_the_pack_command_packs_folders_and_says_which_were_packed",
    "python -m sglang_mepic.check_model": "tests/gate/e2e/test_check_model_server.py::test_tiny_random_model_fails",
    "python -m sglang_mepic.launch.warm":
        "tests/frontend/e2e/test_known_texts_server.py::test_the_warm_command_registers_a_folder_and_a_jsonl_file",
    "python -m sglang_mepic.launch.fork_server":
        "tests/launch/e2e/test_fork_server_server.py::test_a_forked_server_serves_what_a_cold_one_serves",
    "python -m sglang_mepic.kernels.aot": "tests/attention/test_kernels.py::test_compiles_for_sm90_and_sm80",
    "python eval/bench/attention.py": "tests/tooling/test_eval_bench.py::test_cpu_attention_bench_runs_and_checks_itself",
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
        token = command.split()[-1].removesuffix(".py").replace("/", ".").split(".")[-1]  # eval.experiments.run -> run
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


EVAL_KINDS = ("lib", "bench", "experiments", "reports")  # eval/'s folders of modules (not gpu/, not results/)


def test_every_eval_module_is_named_by_a_test():
    # Not only the documented commands: each module in eval/'s folders (not eval/gpu/) is used or run by some test.
    tests = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
    modules = [(kind, p.stem) for kind in EVAL_KINDS for p in sorted((ROOT / "eval" / kind).glob("*.py"))
               if p.stem != "__init__"]
    assert len(modules) > 20 and not list((ROOT / "eval").glob("[!_]*.py")), "eval/ holds its modules in folders"
    unnamed = [f"{kind}/{stem}" for kind, stem in modules
               if not re.search(rf"eval[./]{kind}[./]{stem}\b|from eval\.{kind} import [\w, ]*\b{stem}\b", tests)]
    assert not unnamed, f"eval modules no test names: {unnamed}"


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
    out = command(capsys, "eval.bench.cache", "--sizes", "100", "--calls", "2")
    (row,) = [line for line in out.splitlines() if re.match(r"\| \d", line)]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[0].replace(",", "")) >= 100 and len(cells) == 10  # cached pages, then nine timings
    assert all(float(x) >= 0 for c in cells[1:] for x in c.split(" / "))


def test_eval_bench_prefetch(capsys, tiny_model):
    out = command(capsys, "eval.bench.prefetch", "--model", tiny_model, "--chunks", "2", "--chunk-pages", "1,2",
                  "--reps", "2")
    for name in ("sync fetch+place", "want (round 1)", "want+take+place (ready)", "background wait"):
        (row,) = table_rows(out, name)
        assert len(row) == 3 and all(float(c) >= 0 for c in row[1:]), row


def test_eval_known_lookup(capsys):
    out = command(capsys, "eval.bench.known_lookup", "--docs", "30", "--repeat", "2", "--sizes", "200,400")
    assert "[known_lookup] 30 documents registered" in out
    rows = [r for r in (line.split("|")[1:-1] for line in out.splitlines() if re.match(r"\| [\d,]+ \|", line))]
    assert len(rows) == 2 and sum(int(r[2]) for r in rows) > 0  # registered documents found in the prompts


def test_eval_build_calibration(capsys, tmp_path):
    out = command(capsys, "eval.reports.build_calibration", "--questions", "2", "--chunks", "2", "--out", tmp_path / "c.json")
    data = json.loads((tmp_path / "c.json").read_text())
    assert len(data["questions"]) == 2 and all(len(q["chunks"]) == 2 for q in data["questions"])
    assert data["built_by"] == "python -m eval.reports.build_calibration --questions 2 --chunks 2 --seed 33"
    assert f"{len(data['paragraphs'])} paragraphs" in out


def test_eval_headline(capsys):
    # Printed, not --write: the README's block is checked in tests/tooling/test_eval_headline.py.
    out = command(capsys, "eval.reports.headline")
    assert "| figure | median | range | runs | target | source |" in out and "Sources:" in out
    assert "| dataset | system | latency s (ours) |" in out


def test_flags_doc_check(capsys):
    command(capsys, "sglang_mepic.launch.flags_doc", "--check")  # exit 0: docs/flags.md is the table SETTINGS gives


def test_models_builds_the_tiny_model(capsys, tmp_path):
    out = command(capsys, "sglang_mepic.models", "tiny", "--out", tmp_path / "tiny")
    assert out.strip() == str(tmp_path / "tiny")
    assert json.loads((tmp_path / "tiny" / "config.json").read_text())["model_type"] == "llama"
    assert (tmp_path / "tiny" / "model.safetensors").stat().st_size > 1_000_000
