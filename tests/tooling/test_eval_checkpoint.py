"""A stopped eval.experiments.run keeps its finished points and resumes from them (no server needed)."""

import importlib
import json
import lzma
from dataclasses import asdict, replace
from types import SimpleNamespace
from pathlib import Path

import pytest

from eval.experiments import run  # the eval package is registered by conftest.py
from eval.lib import checkpoint, workloads

NAME, PACKED, Checkpoint = checkpoint.NAME, checkpoint.PACKED, checkpoint.Checkpoint
Point, summarize, Request = run.Point, run.summarize, workloads.Request

SETTINGS = {"dataset": "squad", "requests": 2, "new_tokens": 4, "seed": 0, "model": "tiny", "pool_pages": None}


def point(system: str, qps: float, ttft: float) -> Point:
    meta = {"prompt_tokens": 100, "cached_tokens": 0, "mepic_recomputed_tokens": 20}
    outputs = [([1, 2, 3, 4], "a b", meta, ttft, ttft + 0.5), ([5, 6, 7, 8], "c", meta, ttft * 2, ttft + 1.0)]
    return Point(system, qps, 3, 0.8, outputs, [10.0, 40.0, 25.0], 42, 3.0, [(True, 0.0), (False, 0.25)], 512, 60.0)


def test_finished_points_survive_a_stop_and_summarize_as_before(tmp_path):
    first = Checkpoint(tmp_path, SETTINGS, resume=False)
    points = [point("full", 2.0, 0.1), point("mepic", 2.0, 0.2)]
    for p in points:
        first.add(asdict(p))
    with (tmp_path / NAME).open("a") as f:
        f.write('{"system": "mepic", "qps": 4.0, "chu')  # the line being written when the run was killed

    again = Checkpoint(tmp_path, SETTINGS, resume=True)
    assert again.invocations == 2
    assert again.get("mepic", 4.0, 3, 0.8) is None  # the cut line is dropped ...
    assert len((tmp_path / NAME).read_text().splitlines()) == 3  # ... from the file too, so appends stay parseable
    loaded = [Point.load(again.get(p.system, p.qps, p.chunks, p.reuse)) for p in points]
    workload = {(3, 0.8, 0): [Request(docs=(), question="q", answers=("a",))] * 2}
    assert summarize(loaded, workload, 4, 1024) == summarize(points, workload, 4, 1024)
    assert sum(p.wall for p in loaded) == 120.0


def test_resume_under_other_settings_is_refused(tmp_path):
    Checkpoint(tmp_path, SETTINGS, resume=False).add(asdict(point("full", 2.0, 0.1)))
    with pytest.raises(ValueError, match=r"requests: 2 then, 300 now"):
        Checkpoint(tmp_path, {**SETTINGS, "requests": 300}, resume=True)
    assert "full" in (tmp_path / NAME).read_text()  # refused before anything was rewritten


def test_a_fresh_run_sets_the_old_points_aside(tmp_path):
    Checkpoint(tmp_path, SETTINGS, resume=False).add(asdict(point("full", 2.0, 0.1)))
    fresh = Checkpoint(tmp_path, SETTINGS, resume=False)
    assert fresh.get("full", 2.0, 3, 0.8) is None and fresh.set_aside == tmp_path / "points.prev.jsonl"
    assert json.loads(fresh.set_aside.read_text().splitlines()[1])["system"] == "full"


def test_resume_without_a_checkpoint_starts_afresh(tmp_path):
    assert Checkpoint(tmp_path, SETTINGS, resume=True).invocations == 1
    (tmp_path / NAME).write_text("not json\n")
    with pytest.raises(ValueError, match="not an eval.experiments.run checkpoint"):
        Checkpoint(tmp_path, SETTINGS, resume=True)


def row(system, seed, peak, ttft, pool=1000):
    """A per-run row as summarize makes it, with only what aggregate and ratios read."""
    return {"system": system, "qps": 2.0, "chunks": 7, "reuse": 0.85, "seed": seed, "pool_pages": pool,
            "peak_kv_pages": peak, "ttft_p50": ttft, "capped": peak >= run.CAPPED_SHARE * pool, "f1": None}


def test_repeats_aggregate_to_median_and_range_and_capped_runs_leave_the_ratios():
    runs = [row("mepic", 0, 100, 0.2), row("mepic", 1, 120, 0.3), row("mepic", 2, 110, 0.1),
            row("epic-16", 0, 300, 0.4), row("epic-16", 1, 960, 0.5), row("epic-16", 2, 200, 0.2)]
    (mepic, epic) = sorted(run.aggregate(runs), key=lambda r: r["system"], reverse=True)
    assert mepic["peak_kv_pages"] == 110 and mepic["range"]["peak_kv_pages"] == (100, 120) and mepic["runs"] == 3
    assert epic["capped"] == 1 and mepic["capped"] == 0
    assert run.cell(mepic, "peak_kv_pages", "{:.0f}") == "110 (100–120)"
    assert run.cell(epic, "capped", "{}") == "1 of 3"
    (peak,) = [r for r in run.ratios(runs) if r["metric"] == "peak_kv_pages" and r["over"] == "epic-16"]
    # seed 1's epic-16 peak reached the pool: only seeds 0 and 2 count
    assert peak["runs"] == 2 and peak["capped_runs"] == 1
    assert peak["median"] == pytest.approx((100 / 300 + 110 / 200) / 2)
    assert (peak["low"], peak["high"]) == (pytest.approx(100 / 300), pytest.approx(110 / 200))
    (ttft,) = [r for r in run.ratios(runs) if r["metric"] == "ttft_p50" and r["over"] == "epic-16"]
    assert ttft["runs"] == 3 and ttft["median"] == pytest.approx(0.5)  # latency ratios keep capped runs
    assert "1 of 3" in run.table(run.aggregate(runs)) and "no ratio uses them" in run.table(run.aggregate(runs))


def test_ttft_splits_by_whether_the_request_compiled_a_chunk():
    stored = {"prompt_tokens": 100, "cached_tokens": 0, "mepic_recomputed_tokens": 20, "mepic_compiled_tokens": 0}
    compiling = {**stored, "mepic_compiled_tokens": 60}
    outputs = [([1], "a", stored, 0.2, 0.3), ([1], "a", stored, 0.4, 0.5), ([1], "a", compiling, 1.5, 1.6)]
    workload = {(3, 0.8, 0): [Request(docs=(), question="q", answers=("a",))] * 3}
    (row,) = summarize([Point("mepic", 2.0, 3, 0.8, outputs, [1.0], None, 1.0)], workload, 4, 1024)
    assert (row["ttft_p50_stored"], row["ttft_p50_compiling"]) == (0.2, 1.5)
    assert row["compiling_share"] == pytest.approx(1 / 3) and row["compiled_tokens"] == 20
    # a system that compiles nothing has no split and no compiled tokens
    (plain,) = summarize([Point("vanilla", 2.0, 3, 0.8, outputs[:2], [1.0], None, 1.0)], workload, 4, 1024)
    assert plain["ttft_p50_stored"] is None and plain["compiling_share"] is None and plain["compiled_tokens"] is None


def test_a_request_keeps_the_meta_info_the_tables_read_and_drops_the_rest():
    # SGLang's meta_info for one streamed request (trimmed), as the server sent it in an eval run.
    sent = {"id": "4e10", "finish_reason": {"type": "length", "length": 16}, "prompt_tokens": 2074,
            "weight_version": "default", "forward_entry_time": 5.0, "prefill_finished_time": 5.25,
            "queue_time": 0.09, "completion_tokens": 16, "cached_tokens": 0,
            "cached_tokens_details": {"device": 0, "host": 0}, "e2e_latency": 0.26, "request_received_ts": 4.9,
            "decode_throughput": 135.3, "mepic_recomputed_tokens": 186, "mepic_compiled_tokens": 1888,
            "mepic_residency": ["absent"], "mepic_chunks": [[33, 164]]}
    kept = run.kept_meta(sent)
    assert set(kept) == {"finish_reason", "prompt_tokens", "forward_entry_time", "prefill_finished_time",
                         "queue_time", "completion_tokens", "cached_tokens", "mepic_recomputed_tokens",
                         "mepic_compiled_tokens", "mepic_residency"}
    full = Point("mepic", 2.0, 3, 0.8, [([1], "a", sent, 0.4, 0.6, 4.5)], [10.0], None, 1.0, [], 512, 1.0)
    slim = Point("mepic", 2.0, 3, 0.8, [([1], "a", kept, 0.4, 0.6, 4.5)], [10.0], None, 1.0, [], 512, 1.0)
    workload = {(3, 0.8, 0): [Request(docs=(), question="q", answers=("a",))]}
    assert summarize([slim], workload, 4, 1024) == summarize([full], workload, 4, 1024)


def test_a_read_only_checkpoint_writes_nothing(tmp_path):
    assert Checkpoint(tmp_path, SETTINGS, resume=True, read_only=True).records == {}
    assert not (tmp_path / NAME).exists()
    Checkpoint(tmp_path, SETTINGS, resume=False).add(asdict(point("full", 2.0, 0.1)))
    before = (tmp_path / NAME).read_text()
    kept = Checkpoint(tmp_path, SETTINGS, resume=True, read_only=True)
    assert kept.get("full", 2.0, 3, 0.8) and kept.invocations == 1 and (tmp_path / NAME).read_text() == before


def test_tables_only_writes_the_tables_from_the_kept_runs_and_starts_no_server(tmp_path, tiny_model, monkeypatch):
    # A long run stopped partway: full kept one seed, mepic two, epic-16 none of the three asked for.
    monkeypatch.setattr(run, "ServerProcess", lambda *a, **k: pytest.fail("--tables-only started a server"))
    settings = {"dataset": "squad", "requests": 2, "new_tokens": 4, "model": Path(tiny_model).name,
                "pool_pages": None, "host_tier_gb": run.DEFAULT_HOST_TIER_GB}
    kept = Checkpoint(tmp_path, settings, resume=False)
    for system, seed in (("full", 0), ("mepic", 0), ("mepic", 1)):
        kept.add(asdict(replace(point(system, 2.0, 0.1 * (seed + 1)), seed=seed)))
    args = ["--model", tiny_model, "--dataset", "squad", "--qps", "2", "--chunks", "3", "--reuse", "0.8",
            "--requests", "2", "--new-tokens", "4", "--repeats", "3", "--systems", "full,mepic,epic-16",
            "--out", str(tmp_path), "--no-plots", "--tables-only"]
    before = (tmp_path / NAME).read_text()
    run.main(args)
    assert (tmp_path / NAME).read_text() == before  # read, not rewritten: it ran nothing
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted((r["system"], r["seed"]) for r in results["runs"]) == [("full", 0), ("mepic", 0), ("mepic", 1)]
    assert {r["system"]: r["runs"] for r in results["rows"]} == {"full": 1, "mepic": 2}
    assert "full 1 (seed 0), mepic 2 (seeds 0, 1)" in (tmp_path / "table.md").read_text()


def test_the_headline_names_the_runs_each_system_has_when_they_differ():
    headline = importlib.import_module("eval.reports.headline")
    even = {"seeds": [0, 1], "runs": [{"system": s, "seed": k} for s in ("mepic", "full") for k in (0, 1)]}
    assert headline.runs_per_point(even) == "2 run(s) per point"
    stopped = {"seeds": [0, 1, 2], "runs": [*even["runs"], {"system": "mepic", "seed": 2}]}
    assert headline.runs_per_point(stopped) == "runs per point: mepic 3, full 2"


def test_compare_pairs_the_requests_two_systems_ran_with_the_same_seed(tmp_path):
    compare = importlib.import_module("eval.reports.compare")

    def timed(system, forwards, compiled):
        # (before 0.01 s, queue 0, forward f); sent at 100 s; TTFT = before + forward
        outputs = [([1], "a", {"prompt_tokens": 10, "cached_tokens": 0, "queue_time": 0.0,
                               "forward_entry_time": 100.01, "prefill_finished_time": 100.01 + f,
                               "mepic_compiled_tokens": c}, 0.01 + f, 1.0, 100.0)
                   for f, c in zip(forwards, compiled)]
        return replace(point(system, 2.0, 0.1), outputs=outputs)

    store = Checkpoint(tmp_path, SETTINGS, resume=False)
    store.add(asdict(timed("mepic", [0.5, 0.6, 1.0], [0, 0, 40])))
    store.add(asdict(timed("epic-16", [0.4, 0.4, 2.0], [0, 0, 0])))
    store.add(asdict(replace(timed("mepic", [0.5], [0]), qps=4.0)))  # no epic-16 run to pair with
    [row] = compare.compare(compare.load(tmp_path), "mepic", "epic-16")
    assert row["qps"] == 2.0 and row["paired"] == 2  # the request mepic compiled for is left out
    assert row["forward_diff"][1] == pytest.approx(0.15)
    assert row["p50"] == pytest.approx((0.61, 0.41)) and row["mean"][0] < row["mean"][1]
    # All three were sent at once: none ran alone. Sent 10 s later, the second does.
    outputs = timed("epic-16", [0.4, 0.4, 2.0], [0, 0, 0]).outputs
    assert [len(g) for g in compare.alone(outputs)] == [0, 3]
    later = [*outputs[1][:5], 110.0]
    later[2] = {**later[2], "forward_entry_time": 110.01, "prefill_finished_time": 110.41}
    solo, shared = compare.alone([outputs[0], later])
    assert solo == [(pytest.approx(0.4), 10), (pytest.approx(0.4), 10)] and shared == []


def kept(folder: Path) -> list[tuple]:
    return [checkpoint.key(r) for r in checkpoint.read_points(folder)]


def test_points_read_the_same_plain_or_packed_and_the_header_line_stays_first(tmp_path):
    store = Checkpoint(tmp_path, SETTINGS, resume=False)
    for p in (point("full", 2.0, 0.1), point("mepic", 2.0, 0.2)):
        store.add(asdict(p))
    plain = (tmp_path / NAME).read_bytes()
    head, records = checkpoint.read(tmp_path)
    assert head == {"settings": SETTINGS, "invocations": 1} and len(records) == 2
    assert store.pack() == tmp_path / PACKED and not (tmp_path / NAME).exists()
    assert lzma.decompress((tmp_path / PACKED).read_bytes()) == plain  # the same lines, header first
    assert checkpoint.read(tmp_path) == (head, records)
    assert kept(tmp_path) == [("full", 2.0, 3, 0.8, 0), ("mepic", 2.0, 3, 0.8, 0)]
    assert checkpoint.pack(tmp_path) is None and lzma.decompress((tmp_path / PACKED).read_bytes()) == plain


def test_a_resumed_packed_run_appends_beside_it_and_the_next_pack_merges(tmp_path):
    first = Checkpoint(tmp_path, SETTINGS, resume=False)
    first.add(asdict(point("full", 2.0, 0.1)))
    first.add(asdict(point("mepic", 2.0, 0.2)))
    first.pack()
    packed = (tmp_path / PACKED).read_bytes()

    again = Checkpoint(tmp_path, SETTINGS, resume=True)  # --resume of a packed folder
    assert again.invocations == 2 and again.get("full", 2.0, 3, 0.8) and again.get("mepic", 2.0, 3, 0.8)
    assert (tmp_path / PACKED).read_bytes() == packed  # left as it is while the run goes
    assert len((tmp_path / NAME).read_text().splitlines()) == 1  # a header; the packed points are not copied
    again.add(asdict(point("epic-16", 2.0, 0.3)))
    again.add(asdict(point("mepic", 4.0, 0.4)))
    order = [("full", 2.0), ("mepic", 2.0), ("epic-16", 2.0), ("mepic", 4.0)]
    assert [k[:2] for k in kept(tmp_path)] == order  # packed, then appended, none twice
    assert checkpoint.read(tmp_path)[0]["invocations"] == 2

    with (tmp_path / NAME).open("a") as f:
        f.write('{"system": "naive", "qps": 4.0, "chu')  # stopped mid-line
    third = Checkpoint(tmp_path, SETTINGS, resume=True)
    assert third.invocations == 3 and [k[:2] for k in third.records] == order
    assert len((tmp_path / NAME).read_text().splitlines()) == 3  # its header and the two it added

    assert checkpoint.pack(tmp_path) == tmp_path / PACKED and not (tmp_path / NAME).exists()
    lines = lzma.decompress((tmp_path / PACKED).read_bytes()).decode().splitlines()
    assert json.loads(lines[0])["invocations"] == 3 and len(lines) == 5
    assert [k[:2] for k in kept(tmp_path)] == order


def test_a_stop_between_pack_and_removal_reads_once(tmp_path):
    store = Checkpoint(tmp_path, SETTINGS, resume=False)
    store.add(asdict(point("full", 2.0, 0.1)))
    plain = (tmp_path / NAME).read_bytes()
    store.pack()
    (tmp_path / NAME).write_bytes(plain)  # the plain file was not removed yet
    assert len(checkpoint.read_points(tmp_path)) == 1
    checkpoint.pack(tmp_path)
    assert lzma.decompress((tmp_path / PACKED).read_bytes()) == plain


def test_packed_and_plain_under_other_settings_are_refused(tmp_path):
    Checkpoint(tmp_path, SETTINGS, resume=False).pack()
    (tmp_path / NAME).write_text(json.dumps({"settings": {**SETTINGS, "requests": 9}}) + "\n")
    with pytest.raises(ValueError, match="other settings"):
        checkpoint.read_points(tmp_path)
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'nowhere' / NAME} does not exist"):
        checkpoint.read_points(tmp_path / "nowhere")


def test_a_fresh_run_sets_packed_points_aside_as_one_file(tmp_path):
    first = Checkpoint(tmp_path, SETTINGS, resume=False)
    first.add(asdict(point("full", 2.0, 0.1)))
    first.pack()
    Checkpoint(tmp_path, SETTINGS, resume=True).add(asdict(point("mepic", 2.0, 0.2)))
    fresh = Checkpoint(tmp_path, SETTINGS, resume=False)
    assert fresh.records == {} and not (tmp_path / PACKED).exists() and kept(tmp_path) == []
    aside = [json.loads(line) for line in fresh.set_aside.read_text().splitlines()]
    assert aside[0]["invocations"] == 2 and [r["system"] for r in aside[1:]] == ["full", "mepic"]


def test_the_readers_read_a_packed_folder(tmp_path, capsys):
    compare, ttft_split = importlib.import_module("eval.reports.compare"), importlib.import_module("eval.reports.ttft_split")
    meta = {"prompt_tokens": 10, "cached_tokens": 0, "queue_time": 0.0, "forward_entry_time": 100.01,
            "prefill_finished_time": 100.21, "mepic_compiled_tokens": 0}
    store = Checkpoint(tmp_path, SETTINGS, resume=False)
    for system in ("mepic", "epic-16"):
        store.add(asdict(replace(point(system, 2.0, 0.1), outputs=[([1], "a", meta, 0.21, 1.0, 100.0)])))
    plain = (compare.load(tmp_path), ttft_split.groups(tmp_path))
    store.pack()
    assert (compare.load(tmp_path), ttft_split.groups(tmp_path)) == plain
    assert set(plain[1]) == {("mepic", "all stored"), ("epic-16", "all stored")}
    compare.main([str(tmp_path), "mepic", "epic-16"])
    assert "| 2 | 3 | 0.8 | 0 |" in capsys.readouterr().out


def test_the_pack_command_packs_folders_and_says_which_were_packed(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        Checkpoint(folder, SETTINGS, resume=False).add(asdict(point("full", 2.0, 0.1)))
    checkpoint.main(["pack", str(a)])
    checkpoint.main(["pack", str(a), str(b)])
    out = capsys.readouterr().out
    assert f"{a}: already packed" in out and f"{b}: 1 points" in out
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", PACKED, PACKED]
    with pytest.raises(SystemExit):
        checkpoint.main(["pack", str(tmp_path / "nowhere")])


@pytest.fixture
def fake_servers(monkeypatch):
    """eval.experiments.run's servers and points faked: every request answers "a" at once. Yields the systems that ran."""
    ran = []

    class Server:
        url = "http://fake"

        def __init__(self, model, *flags, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def log(self):
            return ""

    def run_point(server, page_size, pool, texts, qps, new_tokens, seed, bar):
        ran.append(qps)
        meta = {"prompt_tokens": 10, "cached_tokens": 0, "completion_tokens": 1}
        return ([([7], "a", meta, 0.1, 0.2, 0.0) for _ in texts], SimpleNamespace(pages=[5.0], occupied=[6.0], anatomy=[]),
                None, 1.0, {})

    monkeypatch.setattr(run, "ServerProcess", Server)
    monkeypatch.setattr(run, "pool_pages", lambda server, page_size: 1024)
    monkeypatch.setattr(run, "run_point", run_point)
    return ran


def test_a_finished_run_leaves_its_points_packed_and_resume_keeps_them(tmp_path, tiny_model, fake_servers):
    args = ["--model", tiny_model, "--dataset", "squad", "--qps", "2", "--chunks", "3", "--reuse", "0.8",
            "--requests", "2", "--new-tokens", "4", "--systems", "full", "--out", str(tmp_path), "--no-plots"]
    run.main(args)
    assert not (tmp_path / NAME).exists() and (tmp_path / PACKED).exists()  # no plain file left behind
    assert kept(tmp_path) == [("full", 2.0, 3, 0.8, 0)] and fake_servers == [2.0]
    run.main([*args, "--qps", "2,4", "--resume"])  # the packed point is kept, only qps 4 runs
    assert fake_servers == [2.0, 4.0] and not (tmp_path / NAME).exists()
    assert kept(tmp_path) == [("full", 2.0, 3, 0.8, 0), ("full", 4.0, 3, 0.8, 0)]
    assert checkpoint.read(tmp_path)[0]["invocations"] == 2
    assert json.loads((tmp_path / "results.json").read_text())["invocations"] == 2
