"""Commands in committed results are portable: paths relative to the repository, and eval.reports.headline
refuses to write an absolute path into the README. No server."""

import json
import re
from pathlib import Path

import pytest

from eval.lib import provenance  # the eval package is registered by conftest.py
from eval.reports import capacity_figures, headline

ROOT = Path(__file__).resolve().parents[2]
# Where a results.json or invocations.jsonl records how it ran: the strings under these keys.
COMMAND_KEYS = {"command", "argv", "model", "out", "cmd"}
# A line that records a command in a table.md, a report or a script.
COMMAND_LINE = re.compile(r"python[\d.]* (?:-m |eval/)|^command|command:")
MACHINE = re.compile(r"/(?:work|root|home|Users)/")  # a checkout or home folder of some machine


def recorded(value, key=None):
    """The strings of a parsed JSON document that sit directly under a command key (lists pass through)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from recorded(v, k)
    elif isinstance(value, list):
        for v in value:
            yield from recorded(v, key)
    elif isinstance(value, str) and key in COMMAND_KEYS:
        yield value


def committed_text_files() -> list[Path]:
    local = ROOT / "eval" / "results" / "local"  # a scratch run's (git-ignored): not committed
    results = [p for p in (ROOT / "eval" / "results").rglob("*")
               if p.is_file() and p.suffix in (".md", ".json", ".jsonl", ".txt", ".sh") and local not in p.parents]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted(results)]


def absolute_commands(path: Path) -> list[str]:
    text = path.read_text()
    if path.suffix in (".json", ".jsonl"):
        docs = [json.loads(text)] if path.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
        return [s for doc in docs for s in recorded(doc) if provenance.absolute_paths(s)]
    return [line for line in text.splitlines() if COMMAND_LINE.search(line) and provenance.absolute_paths(line)]


def test_committed_commands_name_no_absolute_path():
    bad = {str(p.relative_to(ROOT)): lines for p in committed_text_files() if (lines := absolute_commands(p))}
    assert not bad, "commands with absolute paths (write them relative to the repository):\n" + json.dumps(bad, indent=1)


def test_committed_results_name_no_checkout_or_home_folder():
    bad = [f"{p.relative_to(ROOT)}:{i}: {line.strip()[:120]}" for p in committed_text_files()
           for i, line in enumerate(p.read_text().splitlines(), 1) if MACHINE.search(line)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_a_planted_absolute_command(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"command": "python -m eval.experiments.run --model /home/me/models/tiny", "rows": [],
                                   "model": "tiny", "args": {"out": "/srv/out", "seed": 1}}))
    table = tmp_path / "table.md"
    table.write_text("Command: `python -m eval.experiments.run --out /tmp/x`\nmepic / epic-16 at 1,024 pages, from http://h:1/x\n")
    assert absolute_commands(results) == ["python -m eval.experiments.run --model /home/me/models/tiny", "/srv/out"]
    assert absolute_commands(table) == ["Command: `python -m eval.experiments.run --out /tmp/x`"]


def test_harnesses_record_paths_inside_the_repository_relative_to_it():
    argv = ["--model", str(ROOT / "models" / "tiny-4l"), f"--out={ROOT}/eval/results/x", "--raw-dir", "/tmp/scratch",
            "two words"]
    assert provenance.command("eval.experiments.run", argv) == ("python -m eval.experiments.run --model models/tiny-4l "
                                                     "--out=eval/results/x --raw-dir /tmp/scratch 'two words'")
    assert provenance.portable(ROOT) == "." and provenance.portable("models/tiny") == "models/tiny"


def test_a_path_under_a_repository_folder_that_links_elsewhere_is_recorded_relative(monkeypatch, tmp_path):
    """models/ linked to another disk (as a clone that shares one checkout's models has it): the path resolved
    lies outside the repository, and the command recorded /repo/models/tiny-4l, absolute, which the headline
    then refuses to cite."""
    repo, disk = tmp_path / "repo", tmp_path / "disk"
    (disk / "tiny-4l").mkdir(parents=True)
    repo.mkdir()
    (repo / "models").symlink_to(disk)
    monkeypatch.setattr(provenance, "ROOT", repo)
    assert provenance.portable(str(repo / "models" / "tiny-4l")) == "models/tiny-4l"
    assert provenance.portable(f"--model={repo}/models/../models/tiny-4l") == "--model=models/tiny-4l"
    assert provenance.portable(str(disk / "tiny-4l")) == str(disk / "tiny-4l")  # outside: kept as given


def test_headline_refuses_to_write_an_absolute_path(monkeypatch, capsys):
    load, written = headline.load, []

    def with_absolute_model(path):
        results = load(path)
        if path == headline.SMOL_TTFT["squad"]:
            results = {**results, "command": results["command"] + " --model /home/me/models/smollm2-135m"}
        return results

    monkeypatch.setattr(headline, "load", with_absolute_model)
    monkeypatch.setattr(headline, "replace", lambda *args: written.append(args))
    with pytest.raises(SystemExit) as stop:
        headline.main(["--write"])
    message = str(stop.value)
    assert message.startswith("eval.reports.headline: refusing to write absolute paths")
    assert "docs/results.md (figures): /home/me/models/smollm2-135m" in message  # where the commands are cited
    assert written == []  # nothing written: not the README, not docs/results.md


def test_the_committed_headline_passes_the_check():
    # What --write would put in the README and docs/results.md today: no absolute path.
    head, figures = headline.headline(), headline.all_figures()
    headline.refuse_absolute_paths([(ROOT / "README.md", "headline", head),
                                    (ROOT / "docs" / "results.md", "figures", figures),
                                    (ROOT / "docs" / "results.md", "table2", headline.table2()),
                                    (ROOT / "docs" / "results.md", "capacity", headline.capacity_tables())])
    assert "| claim | median | range | seeds | target | measured on | source |" in head
    assert "| figure | median | range | runs | target | source |" in figures


def test_a_capacity_row_names_the_machine_its_cells_ran_on():
    """Issue 71: the headline's capacity rows say which machine each figure comes from. The device path records
    the device (eval/gpu/e2e/capacity.py); runs recorded before invocations named one ran on the 2-core CPU."""
    args = {"model": "/x/llama3-8b", "dataset": "squad", "chunks": "7"}
    on_device = {"args": args, "invocations": [{"argv": []}, {"argv": [], "machine": "NVIDIA H200"}]}
    assert capacity_figures.run_of(on_device) == "llama3-8b, squad, 7 chunks; NVIDIA H200"
    assert capacity_figures.run_of({"args": args, "invocations": [{"argv": []}]}).endswith("; 2-core CPU")
    rows = capacity_figures.capacity_rows({**on_device, "cells": []}, ROOT / "eval" / "results" / "x" / "results.json")
    assert rows and all("NVIDIA H200" in row for row in rows)


def test_the_headline_is_one_row_per_claim_and_marks_a_baseline_that_shared():
    """The README's table holds a row per claim (about ten, each naming its machine and commit or "not run");
    every run's figures go to docs/results.md, where a ratio over an epic-16 that read stored pages in place
    says it is withdrawn."""
    from eval.experiments import capacity_probe
    from eval.reports import claims

    rows = [line for line in headline.headline().splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) == len(claims.CLAIMS) <= 12
    assert all(" not run " in r or "CPU" in r or "H100" in r or "H200" in r for r in rows)

    def cell(system, fallbacks):
        probe = {"rate": 1.0, "ok": True, "counters": {"private_copy_fallbacks": fallbacks}}
        return capacity_probe.Cell(system=system, pool_pages=512, seed=0, capacity=1.0, probes=[probe])

    assert "withdrawn" in capacity_figures.shared_note([cell("epic-16", 3), cell("mepic", 0)])
    assert capacity_figures.shared_note([cell("epic-16", 0), cell("mepic", 0)]) == ""


def test_every_figure_keeps_the_ratios_over_epic_16_host_and_of_mepic_fp8_a_headline_row_read(monkeypatch, tmp_path):
    """When a headline row moves to a newer run, the figure it read before stays in docs/results.md's list
    (README: "the superseded and withdrawn ones with them"). The list read mepic over epic-16 and vanilla only,
    so the rows over epic-16-host, mepic-fp8's and the requests in flight left no trace there."""
    def cell(system, seed, cap, in_flight):
        probe = {"rate": cap, "ok": True, "in_flight": in_flight, "counters": {"private_copy_fallbacks": 0}}
        return {"system": system, "pool_pages": 768, "seed": seed, "capacity": cap, "probes": [probe], "kind": "capacity"}

    cells = [cell("epic-16-host", s, 0.2, 0.5) for s in range(3)]
    cells += [cell("mepic", s, 0.3 + 0.1 * s, 1.0) for s in range(3)]
    cells += [cell("mepic-fp8", s, 0.8, 2.0) for s in range(3)]
    path = tmp_path / "results.json"
    monkeypatch.setattr(capacity_figures, "rel", lambda p: p.name)
    rows = capacity_figures.more_capacity_rows(path, {"cells": cells, "args": {"model": "models/tiny-4l"}})
    assert any(r.startswith("| capacity within the SLO, mepic / epic-16-host, at 768 pages") and "| 2.00 | 1.50–2.50 | 3 |"
               in r for r in rows), rows
    assert any(r.startswith("| capacity within the SLO, mepic-fp8 / epic-16-host, at 768 pages") and "| 4.00 |" in r
               for r in rows), rows
    assert any(r.startswith("| requests in flight at capacity, mepic / epic-16-host, at 768 pages") and "| 2.00 |" in r
               for r in rows), rows
    assert not any("/ epic-16," in r or "/ vanilla," in r for r in rows)  # no cells, no row


def test_every_figure_gives_a_capacity_run_s_ratios_at_each_of_its_pools(monkeypatch, tmp_path):
    """capacity-decode-host-pools ran 768 and 1,536 pages; the list read its smallest pool alone, so the 1,536
    figures (where memory binds less) were in no table."""
    def cell(system, pool, cap, in_flight):
        probe = {"rate": cap, "ok": True, "in_flight": in_flight, "counters": {"private_copy_fallbacks": 0}}
        return {"system": system, "pool_pages": pool, "seed": 0, "capacity": cap, "probes": [probe], "kind": "capacity"}

    cells = [cell("epic-16-host", 768, 0.2, 0.5), cell("mepic", 768, 0.3, 1.0),
             cell("epic-16-host", 1536, 0.5, 1.5), cell("mepic", 1536, 1.3, 4.5)]
    monkeypatch.setattr(capacity_figures, "rel", lambda p: p.name)
    rows = capacity_figures.more_capacity_rows(tmp_path / "results.json", {"cells": cells, "args": {}})
    assert [r.split(" (")[0] + " | " + r.split(" | ")[1] for r in rows] == [
        "| capacity within the SLO, mepic / epic-16-host, at 768 pages | 1.50",
        "| requests in flight at capacity, mepic / epic-16-host, at 768 pages | 2.00",
        "| capacity within the SLO, mepic / epic-16-host, at 1,536 pages | 2.60",
        "| requests in flight at capacity, mepic / epic-16-host, at 1,536 pages | 3.00"], rows


def test_a_row_names_every_commit_and_day_its_run_was_resumed_on():
    """A run resumed on another day at another commit (capacity-decode-host-pools: seeds 0-1 at c4256ba on
    2026-12-06, seed 2's last cells at 9790d9a on 2026-12-07) read as measured at the last alone."""
    from eval.reports import claims

    def run(commit, started):
        return {"argv": [], "commit": commit, "started": started, "machine": "2-core CPU"}

    resumed = {"invocations": [run("c4256ba", "2026-12-06 21:22"), run("c4256ba", "2026-12-06 22:28"),
                               run("9790d9a", "2026-12-07 00:53")]}
    assert claims.measured_on(ROOT, resumed) == "2-core CPU; c4256ba to 9790d9a; 2026-12-06 to 2026-12-07"
    one = {"invocations": [run("378553f", "2026-12-05 10:00"), run("378553f", "2026-12-05 11:00")]}
    assert claims.measured_on(ROOT, one) == "2-core CPU; 378553f; 2026-12-05"


def test_a_row_names_only_the_commits_that_ran_the_pool_it_judges():
    """A later invocation at a larger pool (capacity-decode-host-pools' 1,536 point at 9c29a40) measured none of
    the bound pool's figures the row reads, so it does not stretch the row's commits and days."""
    from eval.reports import claims

    def run(commit, started, pools):
        return {"argv": ["--systems", "mepic", "--pools", pools, "--seeds", "0"], "commit": commit,
                "started": started, "machine": "2-core CPU"}

    def cell(pool):
        return {"system": "mepic", "pool_pages": pool, "seed": 0, "capacity": 0.5, "kind": "capacity"}

    results = {"invocations": [run("c4256ba", "2026-12-06 21:22", "768"), run("9790d9a", "2026-12-07 00:53", "768"),
                               run("9c29a40", "2026-12-07 02:40", "1536")],
               "cells": [cell(768), cell(1536)]}
    assert claims.bound_pool(results) == 768
    assert claims.measured_on(ROOT, results) == "2-core CPU; c4256ba to 9790d9a; 2026-12-06 to 2026-12-07"
    both = {**results, "invocations": [*results["invocations"], run("aaaaaaa", "2026-12-08 01:00", "768,1536")]}
    assert claims.measured_on(ROOT, both) == "2-core CPU; c4256ba to aaaaaaa; 2026-12-06 to 2026-12-08"
    # Every spelling the harness's parser accepts names the pool (it was read by hand: `--pools` alone).
    for argv in (["--pools=1536"], ["--pool", "1536"], ["--pools", "1536", "--unknown-device-flag", "x"]):
        later = {**results, "invocations": [*results["invocations"][:2], {**run("bbbbbbb", "2026-12-09 01:00", ""),
                                                                          "argv": argv}]}
        assert claims.measured_on(ROOT, later) == "2-core CPU; c4256ba to 9790d9a; 2026-12-06 to 2026-12-07", argv
