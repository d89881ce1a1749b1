"""eval.experiments.capacity: the rate search, the SLO judgement, matched concurrency, the tables; and --quick end to end. The unit half: the whole description, and the tests on a server, are in
e2e/test_eval_capacity_server.py."""

import dataclasses
import json
import threading
import time
from types import SimpleNamespace

import pytest

from eval.experiments import capacity, capacity_probe, capacity_report  # the eval package is registered by conftest.py

ARGS = SimpleNamespace(ttft_slo=2.0, e2e_slo=8.0, attainment=0.95, queue_slack=0.5)


def fake(capacity_rps: float, in_flight_per_rps: float = 2.0):
    """A system that holds every rate up to capacity_rps; in flight grows with the rate."""
    def run(rate):
        return SimpleNamespace(rate=rate, ok=rate <= capacity_rps, in_flight=rate * in_flight_per_rps)
    return run


@pytest.mark.parametrize("true_capacity", [0.3, 1.0, 2.0, 5.0, 13.7, 40.0])
def test_the_search_brackets_then_bisects_to_the_resolution(true_capacity):
    found, probes = capacity_probe.search(fake(true_capacity), start=2.0, lo=0.25, hi=64.0, resolution=0.15, max_probes=20)
    assert found <= true_capacity < found * 1.15 + 1e-9
    assert all(p.ok == (p.rate <= true_capacity) for p in probes)
    assert len(probes) <= 12


def test_the_search_ends_at_its_limits():
    assert capacity_probe.search(fake(0.1), 2.0, 0.25, 64.0, 0.15, 20)[0] == 0.0  # fails even at the lowest rate
    assert capacity_probe.search(fake(100.0), 2.0, 0.25, 64.0, 0.15, 20)[0] == 64.0
    found, probes = capacity_probe.search(fake(5.0), 2.0, 0.25, 64.0, 0.15, 3)  # the probe budget binds
    assert len(probes) == 3 and found == 4.0


def outputs(ttfts, e2es, queues):
    return [([], "", {"queue_time": q}, t, e, 0.0) for t, e, q in zip(ttfts, e2es, queues)]


def test_a_probe_holds_when_95_percent_meet_the_slo_and_the_queue_does_not_grow():
    sampler = SimpleNamespace(pages=[10.0, 30.0, 20.0], anatomy=[])
    n = 60
    good = capacity_probe.judge(outputs([0.5] * n, [3.0] * n, [0.01] * n), 2.0, 30.0, sampler, None, {}, ARGS)
    assert good.ok and good.attainment == 1.0 and good.peak_kv_pages == 30.0 and good.in_flight == 6.0
    slow = capacity_probe.judge(outputs([0.5] * 56 + [3.0] * 4, [3.0] * n, [0.01] * n), 2.0, 30.0, sampler, 35, {}, ARGS)
    assert not slow.ok and slow.attainment == pytest.approx(56 / 60, abs=1e-4) and slow.peak_kv_pages == 35
    assert good.missed == [] and [m["i"] for m in slow.missed] == [56, 57, 58, 59]  # each miss, readable
    assert slow.missed[0] == {"i": 56, "sent_s": 0.0, "queue": 0.01, "ttft": 3.0, "tpot": 0.0, "e2e": 3.0}
    growing = [0.01] * 20 + [0.3] * 20 + [0.9] * 20  # within the SLO, but the queue grows
    assert not capacity_probe.judge(outputs([0.5] * n, [3.0] * n, growing), 2.0, 30.0, sampler, None, {}, ARGS).ok
    lost = capacity_probe.judge(outputs([None] + [0.5] * (n - 1), [3.0] * n, [0.0] * n), 2.0, 30.0, sampler, None, {}, ARGS)
    assert lost.attainment < 1  # a request with no first token did not meet the TTFT SLO
    assert lost.missed[0]["i"] == 0 and lost.missed[0]["ttft"] is None


def test_a_probe_that_ended_early_fails_and_counts_what_it_did_not_finish():
    sampler = SimpleNamespace(pages=[5.0], anatomy=[])
    done = outputs([0.5] * 10, [3.0] * 10, [0.01] * 10)
    cut = {**done[9][2], "finish_reason": {"type": "abort"}}
    probe = capacity_probe.judge(done[:9] + [(*done[9][:2], cut, *done[9][3:])] + [None] * 10, 4.0, 5.0, sampler, None, {},
                           ARGS, ended_early=True)
    assert not probe.ok and probe.ended_early and probe.sent == 10 and probe.requests == 20
    assert probe.attainment == 0.45 and probe.achieved_rps == 1.8  # 9 of 20 finished within the SLO


def test_the_watch_stops_a_probe_once_its_misses_exceed_the_allowance(monkeypatch):
    aborted = []
    monkeypatch.setattr(capacity_probe, "abort_all", aborted.append)
    monkeypatch.setattr(capacity_probe, "scheduler_counters", lambda url: {"retractions": 0.0, "stages": {"idle": 1.0}})
    watch = capacity_probe.Watch("http://x", 60, ARGS)  # 95% of 60: 3 misses allowed
    assert watch.allowed == 3
    for i in range(3):
        watch.sent(i)
        watch.done(i, ([], "", {}, 2.5, 3.0, 0.0))  # TTFT over the SLO
    watch.sent(3)
    watch.done(3, ([], "", {}, 0.5, 3.0, 0.0))  # within it
    assert not watch.stop.is_set() and aborted == []
    watch.sent(4)
    watch._sent[4] -= ARGS.e2e_slo + 1  # in flight past the e2e target: a certain miss
    watch.check()
    assert watch.stop.is_set() and aborted == ["http://x"]
    assert watch.counters_at_stop == {"retractions": 0.0, "stages": {"idle": 1.0}}  # read before the abort
    watch.check()
    assert aborted == ["http://x"]  # aborted once


def test_a_cell_starts_its_search_from_its_neighbours():
    args = SimpleNamespace(start_rate=2.0, min_rate=0.25, resolution=0.15)
    assert capacity.warm_start([], "mepic", 1024, args) == (2.0, 2.0)  # nothing run yet: doubling from the start
    cells = [cell("mepic", 512, 3.0), cell("vanilla", 1024, 9.0)]
    assert capacity.warm_start(cells, "mepic", 1024, args) == (3.0, pytest.approx(1.3225))  # the smaller pool's
    cells += [cell("mepic", 1024, 5.0), cell("mepic", 1024, 6.0), cell("mepic", 1024, 8.0)]
    assert capacity.warm_start(cells, "mepic", 1024, args)[0] == 6.0  # the seeds already run there
    assert capacity.warm_start([cell("mepic", 512, 0.0)], "mepic", 1024, args) == (2.0, 2.0)  # held nothing
    found, probes = capacity_probe.search(fake(3.5), 3.0, 0.25, 64.0, 0.15, 20, step=1.3225)
    assert found <= 3.5 < found * 1.15 and len(probes) <= 3
    # A start far below (cacheblend-0.15's seed 1 after seed 0's 0.06 req/s): the step strides out after two, and
    # five probes bracket a capacity 4.5 times the start, where five steps of 1.44 held at every one.
    found, probes = capacity_probe.search(fake(0.28), 0.062, 0.05, 64.0, 0.2, 5, step=1.44)
    assert any(not p.ok for p in probes) and found <= 0.28 < found * 2, [(p.rate, p.ok) for p in probes]


class NoSampler:
    """eval.experiments.run's KV sampler, without a server."""
    period, pages = 0.0, []

    def __init__(self, *a):
        self.stop = threading.Event()

    def start(self):
        pass

    def join(self):
        pass


def offline(monkeypatch, stream):
    """eval.experiments.run's run_point without a server: requests answered by `stream`, nothing flushed or sampled."""
    from eval.experiments import run

    monkeypatch.setattr(run, "stream", stream)
    monkeypatch.setattr(run, "flush", lambda url: None)
    monkeypatch.setattr(run, "mepic_stats", lambda server: {})
    monkeypatch.setattr(run, "Sampler", NoSampler)
    return run


def test_a_closed_loop_keeps_as_many_requests_in_flight_as_it_has_clients(monkeypatch):
    in_flight, most, lock = [0], [0], threading.Lock()

    def stream(url, text, new_tokens, ignore_eos=False):
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
        time.sleep(0.01)
        with lock:
            in_flight[0] -= 1
        return [1], text, {}, 0.005, 0.01, 0.0

    run = offline(monkeypatch, stream)
    bar = SimpleNamespace(update=lambda: None)
    outputs, *_ = run.run_point(SimpleNamespace(url="http://x"), 16, 64, [f"t{i}" for i in range(40)], 0.0, 4, 0, bar,
                                clients=4)
    assert [o[1] for o in outputs] == [f"t{i}" for i in range(40)]  # every request, each in its place
    assert most[0] == 4


def test_a_request_the_server_refuses_is_a_miss_and_the_probe_goes_on(monkeypatch):
    """A workload draw can hold a request larger than a small pool takes in one request: SGLang streams an error
    object for it (a 4xx in the stream). A capacity probe counts it as a miss and goes on (seeds 3 and 4 of the
    fp8 run at 192 bf16 pages stopped on a KeyError, 2026-11-30); another experiment stops with the server's
    words."""
    from eval.experiments import run

    said = b'data: {"error": {"message": "request needs 3217 KV slots", "code": 400}}'

    class Reply:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def raise_for_status(self):
            pass

        def iter_lines(self):
            return iter([said, b"data: [DONE]"])

    monkeypatch.setattr(run.requests, "post", lambda *a, **k: Reply())
    with pytest.raises(run.Refused, match="3217 KV slots") as refused:
        run.stream("http://x", "t", 4)
    assert refused.value.output()[2]["finish_reason"]["type"] == "refused"

    def stream(url, text, new_tokens, ignore_eos=False):
        if text == "t3":
            raise run.Refused("request needs 3217 KV slots", 0.01, 0.0)
        return [1], text, {}, 0.005, 0.01, 0.0

    offline(monkeypatch, stream)
    bar = SimpleNamespace(update=lambda: None)
    texts = [f"t{i}" for i in range(20)]
    with pytest.raises(run.Refused):
        run.run_point(SimpleNamespace(url="http://x"), 16, 64, texts, 0.0, 4, 0, bar, clients=2)
    outputs, *_ = run.run_point(SimpleNamespace(url="http://x"), 16, 64, texts, 0.0, 4, 0, bar, clients=2,
                                refusals=True)
    assert [o[1] for o in outputs] == ["" if i == 3 else f"t{i}" for i in range(20)]
    probe = capacity_probe.judge(outputs, 2.0, 10.0, SimpleNamespace(pages=[5.0], anatomy=[]), None, {}, ARGS)
    assert probe.refused == 1 and probe.sent == 20 and probe.attainment == 0.95 and probe.ok
    assert probe.ttft_p50 == 0.005  # the refused request has no first token to count
    cell = capacity_probe.Cell("mepic-bf16", 192, 3, 2.0, [dataclasses.asdict(probe)])
    assert "refused (more KV than it takes in one request), each a miss in every probe that sent it: mepic-bf16 " \
           "at 192 pages, seed 3: 1" in capacity_report.capacity_table([cell], ["mepic-bf16"], [192])


def test_a_probe_that_ended_early_does_not_wait_out_its_arrivals(monkeypatch):
    """Once the watch stops a probe, the requests not yet sent are dropped at once, not when their
    arrival times come (a failing probe at 2 req/s would otherwise last its whole 150 s schedule)."""
    def stream(url, text, new_tokens, ignore_eos=False):
        return [1], text, {}, 0.005, 0.01, 0.0

    class StopAfter:
        def __init__(self, n):
            self.stop, self.n = threading.Event(), n

        def sent(self, i):
            pass

        def done(self, i, output):
            self.n -= 1
            if self.n <= 0:
                self.stop.set()

    run = offline(monkeypatch, stream)
    bar = SimpleNamespace(update=lambda: None)
    began = time.perf_counter()
    # 40 requests at 0.5 req/s: about 80 s of arrivals; the watch stops the probe after 3 answers.
    outputs, _, _, seconds, _ = run.run_point(SimpleNamespace(url="http://x"), 16, 64, [f"t{i}" for i in range(40)],
                                              0.5, 4, 0, bar, watch=StopAfter(3))
    assert time.perf_counter() - began < 30 and seconds < 30
    assert 3 <= sum(o is not None for o in outputs) < 40


def test_an_interrupted_run_stops_at_once_and_aborts_what_is_in_flight(monkeypatch):
    """Ctrl-C, or SIGTERM (eval.experiments.capacity turns it into one), mid-probe: the run stops now, not when the
    last arrival of its schedule comes, and the server is told to abort what is in flight."""
    import _thread
    import signal

    aborted = []
    run = offline(monkeypatch, lambda url, text, new_tokens, ignore_eos=False: ([1], text, {}, 0.0, 0.0, 0.0))
    monkeypatch.setattr(run, "abort_all", aborted.append)
    # interrupt_main does nothing while SIGINT is not Python's to handle (an earlier test's library may
    # have left it ignored): Ctrl-C's own handler for the test, the one a user's shell reaches.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.0, _thread.interrupt_main)
    began = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):  # 40 requests at 0.5 req/s: about 80 s of arrivals
            run.run_point(SimpleNamespace(url="http://x"), 16, 64, [f"t{i}" for i in range(40)], 0.5, 4, 0,
                          SimpleNamespace(update=lambda: None))
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert time.perf_counter() - began < 30
    assert aborted == ["http://x"]


def cell(system, pool, cap, peak=100.0, mean=50.0, kind="capacity"):
    probe = {"rate": cap, "ok": True, "peak_kv_pages": peak, "mean_kv_pages": mean, "ttft_p50": 0.2,
             "in_flight": 8.0, "counters": {"retractions": 0, "chunk_evictions": 1, "chunks_compiled": 9}}
    failed = {**probe, "rate": cap * 1.2, "ok": False, "counters": dict(probe["counters"])}  # the search bracketed it
    return capacity_probe.Cell(system, pool, 0, cap, [probe, failed] if kind == "capacity" else [probe], kind)


def test_tables_and_ratios_read_the_cells(tmp_path):
    cells = [cell("vanilla", 512, 0.5), cell("vanilla", 1024, 1.5), cell("mepic", 512, 1.0), cell("mepic", 1024, 3.5),
             cell("epic-16", 1024, 1.0), cell("mepic", 1024, 0, 40, 15, "matched-8"),
             cell("epic-16", 1024, 0, 100, 50, "matched-8"), cell("epic-16-host", 1024, 2.5)]
    cells[3].probes[0].update(sent=50, requests=60)  # the scheduler's busy time a request sent: 7.5 s / 50
    cells[3].probes[0]["counters"]["stage_seconds"] = {"run_batch": 6.0, "get_next_batch_to_run": 1.5, "idle": 2.0}
    text = capacity_report.capacity_table(cells, ["vanilla", "epic-16", "mepic"], [512, 1024])
    assert "| mepic | 1,024 | 3.50 | 100 | 50 | 0 | 1 | 9 | 0.200 | 0.0 | 8.0 | 0.00 | 0 | 150 | compute | 2 |" in text
    assert "| vanilla | 1,024 | 1.50 | 100 | 50 | 0 | 1 | 9 | 0.200 | 0.0 | 8.0 | 0.00 | 0 | — | compute | 2 |" in text  # no counters
    lines = capacity_report.ratios(cells, [512, 1024])
    assert lines[0].startswith("at 1,024 pages")  # vanilla holds 1 req/s there first
    # Issue 86's targets: 2.0 over either EPIC (its store in the pool or on the host), 1.5 over vanilla.
    assert "- capacity mepic / epic-16: 3.50 (target >= 2.0: met)" in lines
    assert "- capacity mepic / epic-16-host: 1.40 (target >= 2.0: missed)" in lines
    assert "- capacity mepic / vanilla: 2.33 (target >= 1.5: met)" in lines
    matched = capacity_report.matched_table(cells, ["epic-16", "mepic"])
    assert "| 8 | mepic / epic-16 | 0.40 | 0.30 | peak ≤ 0.5: met, time-weighted ≤ 0.4: met |" in matched
    capacity_report.plot(cells, ["vanilla", "epic-16", "mepic"], [512, 1024], tmp_path / "c.png")
    assert (tmp_path / "c.png").stat().st_size > 1000


def test_matched_runs_report_their_anatomy_and_stand_in_for_a_missing_capacity_point():
    """At 512 pages on a busy CPU no rate held, so no capacity point has an anatomy: the matched runs' means
    (requests admitted among them) are what tells two systems' pages apart."""
    from eval.lib import anatomy

    def sampled(system, running, private):
        c = cell(system, 512, 0, kind="matched-8")
        c.probes[0]["anatomy"] = anatomy.summarise([
            {"t": t, "used_pages": 500, "running_requests": running, "pad_slots": 10, "page_size": 16,
             **{k: 0 for k in anatomy.CATEGORIES}, "private": private, "chunk_read_1": 500 - private}
            for t in range(3)])
        return c
    cells = [cell("epic-16", 512, 0), cell("mepic", 512, 0), sampled("epic-16", 3, 80), sampled("mepic", 5, 60)]
    text = capacity_report.anatomy_section(cells, ["epic-16", "mepic"], [512])
    assert "capacity point" not in text  # no rate held: no capacity-point table
    assert "| epic-16, 8 in flight (seed 0) | 512 | 500.0 | 3.0 | 80.0 |" in text
    assert "| mepic, 8 in flight (seed 0) | 512 | 500.0 | 5.0 | 60.0 |" in text
    panels = capacity_report.anatomy_panels(cells, ["epic-16", "mepic"], [512])
    assert [label for label, _ in panels] == ["epic-16, 512 pages, 8 in flight, seed 0",
                                              "mepic, 512 pages, 8 in flight, seed 0"]


def test_a_slow_model_gets_its_ratios_without_a_target_verdict():
    """SmolLM2 on a CPU: vanilla under 1 req/s at its one pool. The ratio is what the run is for; no target
    is judged there (the targets are read where vanilla sustains 1 req/s)."""
    lines = capacity_report.ratios([cell("vanilla", 512, 0.28), cell("mepic", 512, 0.8)], [512])
    assert lines[0].startswith("at 512 pages") and "not judged" in lines[0]
    assert lines[1:] == ["- capacity mepic / vanilla: 2.86"]


def test_a_cell_says_what_stopped_it():
    def probe(rate, ok, peak, retractions=0):
        return {"rate": rate, "ok": ok, "peak_kv_pages": peak, "counters": {"retractions": retractions}}
    full = capacity_probe.Cell("vanilla", 512, 0, 2.0, [probe(2.0, True, 300), probe(4.0, False, 500), probe(8.0, False, 400)])
    assert capacity_report.stopped_by(full) == "pool"  # the lowest failing rate filled the pool
    retracted = capacity_probe.Cell("vanilla", 512, 0, 2.0, [probe(2.0, True, 300), probe(2.5, False, 420, retractions=3)])
    assert capacity_report.stopped_by(retracted) == "pool"
    queue = capacity_probe.Cell("mepic", 512, 0, 4.0, [probe(4.0, True, 100), probe(8.0, False, 200), probe(5.0, False, 150)])
    assert capacity_report.stopped_by(queue) == "compute"  # no stage counters recorded
    stages = {"run_batch": 30.0, "get_next_batch_to_run": 8.0, "process_batch_result": 2.0, "idle": 20.0}
    queue.probes[2]["counters"]["stage_seconds"] = stages
    assert capacity_report.stopped_by(queue) == "queue"  # idle a third of the time, the pool not full: neither
    stages["idle"] = 1.0  # saturated: the forward took 75% of the busy time
    assert capacity_report.stopped_by(queue) == "forward (75% forward)"
    stages["get_next_batch_to_run"] = 40.0
    assert capacity_report.stopped_by(queue) == "scheduler (42% forward)"
    full.probes[1]["counters"]["stage_seconds"] = {"run_batch": 9.0, "idle": 1.0}
    assert capacity_report.stopped_by(full) == "forward (100% forward)"  # a full pool past capacity is a symptom
    # it held at every rate probed: the search ran out of probes, and its capacity is a lower bound
    unbracketed = capacity_probe.Cell("mepic", 512, 0, 0.27, [probe(0.06, True, 100), probe(0.27, True, 100)])
    assert capacity_report.stopped_by(unbracketed) == "not reached: held at every rate probed (a lower bound)"
    assert capacity_report.stopped_by(capacity_probe.Cell("mepic", 512, 0, 2.0, [probe(1.0, False, 100)])) == "—"


def test_the_scheduler_counters_are_read_from_sglangs_metrics(monkeypatch):
    text = "\n".join([
        '# HELP sglang:num_retracted_requests_total ...',
        'sglang:num_retracted_requests_total{model_name="m",tp_rank="0"} 3.0',
        'sglang:scheduler_stage_seconds_total{category="run_batch",forward_overlap="none",tp_rank="0"} 12.5',
        'sglang:scheduler_stage_seconds_total{category="idle",forward_overlap="none",tp_rank="0"} 4.0',
        'sglang:scheduler_stage_seconds_total_created{category="idle"} 1.7e9'])
    monkeypatch.setattr(capacity_probe.requests, "get", lambda url, timeout: SimpleNamespace(text=text))
    before = capacity_probe.scheduler_counters("http://x")
    assert before == {"retractions": 3.0, "stages": {"run_batch": 12.5, "idle": 4.0}}
    after = {"retractions": 5.0, "stages": {"run_batch": 20.0, "idle": 4.5, "other": 0.25}}
    assert capacity_probe.scheduler_delta(before, after) == {"retractions": 2.0, "stage_seconds": {
        "run_batch": 7.5, "idle": 0.5, "other": 0.25}}


def test_a_cut_line_in_the_saved_cells_is_dropped(tmp_path):
    good = json.dumps(capacity.asdict(cell("mepic", 512, 1.0)))
    (tmp_path / "cells.jsonl").write_text(good + "\n" + good[:40])
    assert [c.capacity for c in capacity.load_cells(tmp_path / "cells.jsonl")] == [1.0]


def test_a_budget_starts_no_server_that_would_be_up_too_late(monkeypatch):
    """The device path's calls end at a hard limit: a cell whose server could not be up `server_start_s` before
    the deadline is not started (no server made), and the run stops with the cells it has."""
    made = []
    args = SimpleNamespace(together=False, warmup=0, e2e_slo=8.0, new_tokens=4)
    with pytest.raises(capacity.OutOfTime, match="would be up past the budget"):
        capacity.run_cells(args, [("mepic", 512, 0, "capacity")], [], lambda c: None,
                           lambda system, pool: made.append((system, pool)), {0: ["a"]},
                           deadline=capacity.time.time() + 100, server_start_s=170)
    assert made == []


def test_a_server_that_fails_to_start_still_leaves_the_report_of_the_cells_before_it(tmp_path):
    """On the device a call is one chance: a server that dies at start ends the run with its error, after the
    invocation and the table of the cells finished so far are written."""
    from sglang_mepic.process.server_process import ServerError

    args = capacity.parser().parse_args(["--out", str(tmp_path), "--systems", "mepic", "--pools", "512",
                                         "--seeds", "0", "--matched", ""])
    asked = capacity.plan(args)

    class Dead:
        def launch(self):
            raise ServerError("server exited with code 1: boom")

        def stop(self):
            pass

    with pytest.raises(ServerError, match="boom"):
        capacity.run(args, [], asked, "tiny", lambda seeds: ({0: ["a"]}, lambda system, pool: Dead()))
    (invocation,) = [json.loads(line) for line in (tmp_path / "invocations.jsonl").read_text().splitlines()]
    assert invocation["stopped"] == "a server failed" and invocation["cells_run"] == 0
    assert "(stopped part way: a server failed)" in (tmp_path / "table.md").read_text()
    # the machine's speed that day, beside its load: runs of two sessions are paired only where it agrees
    assert invocation["cpu_probe_ms"] > 0
    assert f"CPU probe {invocation['cpu_probe_ms']:g} ms" in (tmp_path / "table.md").read_text()


def test_equal_bytes_gives_each_kv_dtype_the_pages_its_bytes_hold_and_fp8_is_read_against_bf16():
    """Issue 73: at one pool size in bytes (pages of a bf16 cache), fp8 holds twice the pages, the float32
    cache of this CPU's servers half; without --equal-bytes every system gets the pool as pages."""
    assert capacity.pool_pages_for("mepic-fp8", 256, equal_bytes=True) == 512
    assert capacity.pool_pages_for("mepic-bf16", 256, equal_bytes=True) == 256
    assert capacity.pool_pages_for("mepic", 256, equal_bytes=True) == 128  # float32 KV
    assert capacity.pool_pages_for("mepic", 256, equal_bytes=True, model_dtype="bfloat16") == 256
    assert capacity.pool_pages_for("mepic-fp8", 256, equal_bytes=False) == 256
    base, flags = capacity.system_flags("mepic-fp8")
    assert base == "mepic" and flags[-2:] == ["--kv-cache-dtype", "fp8_e5m2"] and "--mepic-mode" in flags
    assert capacity.system_flags("epic-16") == ("epic-16", ["--mepic-mode", "epic-16"])
    args = capacity.parser().parse_args(["--systems", "mepic-bf16,mepic-fp8", "--pools", "256", "--equal-bytes"])
    assert capacity.plan(args).systems == ["mepic-bf16", "mepic-fp8"] and args.equal_bytes

    cells = [cell("mepic-bf16", 256, 2.0), cell("mepic-fp8", 256, 3.6)]
    cells[0].server_pages, cells[1].server_pages = 256, 512
    text = capacity_report.capacity_table(cells, ["mepic-bf16", "mepic-fp8"], [256])
    assert "| system | pool (bf16 pages' bytes): pages held |" in text
    assert "| mepic-fp8 | 256: 512 | 3.60 |" in text and "| mepic-bf16 | 256 | 2.00 |" in text
    assert "- at 256 pages, capacity mepic-fp8 / mepic-bf16: 1.80 (target >= 1.6: met)" in capacity_report.ratios(cells, [256])
    none = [*cells, cell("mepic-bf16", 256, 0.0), cell("mepic-fp8", 256, 9.0)]
    none[2].seed = none[3].seed = 3  # a seed where bf16 held no rate: left out of the ratio, and said so
    assert ("- at 256 pages, capacity mepic-fp8 / mepic-bf16: 1.80 (target >= 1.6: met); seed 3 left out: "
            "mepic-bf16 held no rate there") in capacity_report.ratios(none, [256])


def test_a_decode_heavy_request_is_judged_on_its_time_per_output_token():
    """With --tpot-slo a request whose first token came fast but whose decode crawled misses, as vLLM's and
    SGLang's goodput judge it; without it only TTFT and e2e count. e2e defaults to what the two allow."""
    def out(ttft, e2e, tokens):
        return ([], "", {"completion_tokens": tokens}, ttft, e2e, 0.0)
    fast_decode, slow_decode = out(0.5, 0.5 + 255 * 0.02, 256), out(0.5, 0.5 + 255 * 0.05, 256)
    assert capacity_probe.tpot(slow_decode) == pytest.approx(0.05) and capacity_probe.tpot(out(0.5, 0.6, 1)) == 0.0
    judged = SimpleNamespace(ttft_slo=2.0, e2e_slo=100.0, tpot_slo=0.04)
    assert capacity_probe.meets(fast_decode, judged) and not capacity_probe.meets(slow_decode, judged)
    assert capacity_probe.meets(slow_decode, SimpleNamespace(ttft_slo=2.0, e2e_slo=100.0))  # no TPOT SLO
    args = capacity.parser().parse_args(["--new-tokens", "256", "--tpot-slo", "0.04", "--pools", "64",
                                         "--systems", "mepic"])
    capacity.plan(args)
    assert args.e2e_slo == pytest.approx(2.0 + 0.04 * 255)
    probe = capacity_probe.judge([fast_decode, slow_decode], 1.0, 10.0, SimpleNamespace(pages=[], anatomy=[]), None, {},
                           SimpleNamespace(**vars(judged), attainment=0.5, queue_slack=0.5))
    assert probe.attainment == 0.5 and probe.tpot_p50 == pytest.approx(0.035, abs=0.016)


@pytest.mark.parametrize("flags, named", [(["--tpot-slo", "0"], "TPOT SLO 0.0 s"),
                                          (["--tpot-slo", "-0.04"], "TPOT SLO -0.04 s"),
                                          (["--ttft-slo", "0"], "TTFT SLO 0.0 s"),
                                          (["--e2e-slo", "0"], "e2e SLO 0.0 s"),
                                          (["--e2e-slo", "nan"], "e2e SLO nan s")])
def test_an_slo_that_no_request_can_meet_is_refused(flags, named):
    """A TTFT, TPOT or e2e SLO of zero or less (or NaN) would judge every request a miss (capacity 0 for every system)
    after minutes of probing; it is refused before any model is built."""
    args = capacity.parser().parse_args(["--systems", "mepic", "--pools", "64", *flags])
    with pytest.raises(SystemExit, match=named):
        capacity.plan(args)
    capacity.plan(capacity.parser().parse_args(["--systems", "mepic", "--pools", "64", "--tpot-slo", "0.04"]))


def test_the_cpu_probe_times_one_thread_and_gives_the_threads_back():
    import torch

    from eval.lib import cpu_speed

    threads = torch.get_num_threads()
    assert cpu_speed.probe_ms() > 0
    assert torch.get_num_threads() == threads


def test_a_ratio_says_which_seeds_only_one_system_ran_and_fp8_is_read_over_each_baseline():
    # seeds 0 and 1 paired; seed 2 has epic-16-host's cell alone (mepic's was stopped part way)
    cells = []
    for seed, (host, mine, fp8) in enumerate([(0.35, 0.50, 0.84), (0.14, 0.26, 0.48), (0.08, None, None)]):
        for system, rate in (("epic-16-host", host), ("mepic", mine), ("mepic-fp8", fp8)):
            if rate is not None:
                c = cell(system, 768, rate)
                c.seed = seed
                cells.append(c)
    lines = capacity_report.ratios(cells, [768])
    mepic = next(line for line in lines if line.startswith("- capacity mepic / epic-16-host"))
    assert mepic.endswith("; seed 2 left out: mepic has no cell there"), mepic
    fp8 = next(line for line in lines if line.startswith("- capacity mepic-fp8 / epic-16-host"))
    assert fp8.endswith("; seed 2 left out: mepic-fp8 has no cell there"), fp8


def test_a_ratio_over_a_cell_that_held_at_every_rate_probed_is_a_bound():
    """cacheblend-0.15's seed 1 at 768 pages (eval/results/capacity-decode-cacheblend) started its search at seed 0's
    0.06 req/s and held at each of its 5 probes up to 0.27: mepic's 0.60 over it is at most 2.25, not 2.25."""
    cells = []
    for seed, (theirs, mine) in enumerate([((0.062, 0.088), 0.5), ((0.267, None), 0.6)]):
        cap, failed = theirs
        blend = cell("cacheblend-0.15", 768, cap)
        blend.probes = blend.probes[:1] + ([{**blend.probes[0], "rate": failed, "ok": False}] if failed else [])
        blend.seed = seed
        ours = cell("mepic", 768, mine)
        ours.seed = seed
        cells += [blend, ours]
    line = next(x for x in capacity_report.ratios(cells, [768]) if x.startswith("- capacity mepic / cacheblend-0.15"))
    assert line == ("- capacity mepic / cacheblend-0.15: 5.16 (2.25–8.06); seed 1: cacheblend-0.15 held at every "
                    "rate probed, so the ratio there is an upper bound"), line
    assert "not reached" in capacity_report.capacity_table(cells, ["cacheblend-0.15", "mepic"], [768])


def test_the_ratios_are_given_at_every_pool_run_the_larger_ones_not_judged():
    """capacity-decode-host-pools ran 768 and 1,536 pages; its table gave the ratios at 768 alone, so the
    figure at the pool where memory binds less (what the gap does as the pool grows) was nowhere but the cells."""
    cells = []
    for pool, (host, mine) in ((768, (0.2, 0.3)), (1536, (0.5, 1.3))):
        for system, rate in (("epic-16-host", host), ("mepic", mine)):
            cells.append(cell(system, pool, rate))
    lines = capacity_report.ratios(cells, [768, 1536])
    assert lines[0].startswith("at 768 pages") and "not judged" in lines[0]
    at = lines.index("at 1,536 pages, seed by seed (not judged):")
    assert lines[1:at] == ["- capacity mepic / epic-16-host: 1.50"]
    assert lines[at + 1:] == ["- capacity mepic / epic-16-host: 2.60"]
