"""eval.experiments.overload reads SGLang's log lines and eval.experiments.run's outputs; the eval scripts serve as eval.experiments.run does. No server."""

import inspect

import pytest
from tqdm import tqdm

from eval.experiments import overload, run, scheduler_profile


def test_report_reads_batches_steps_and_forward():
    log = ("Prefill batch, #new-seq: 1, #new-token: 1400, #cached-token: 190, token usage: 0.01, \n"
           "Prefill batch, #new-seq: 3, #new-token: 4200, #cached-token: 570, token usage: 0.02, \n"
           "Prefill batch, #new-seq: 1, #new-token: 1500, #cached-token: 190, token usage: 0.03, \n"
           "Decode batch, #running-req: 4, #token: 6000, token usage: 0.02, gen throughput (token/s): 400.00, \n"
           "Decode batch, #running-req: 2, #token: 3000, token usage: 0.01, gen throughput (token/s): 100.00, \n")
    meta = {"queue_time": 0.01, "forward_entry_time": 100.02, "prefill_finished_time": 100.12}
    outputs = [([1], "a", meta, 0.15, 0.4, 100.0)]
    line = overload.report("full", outputs, 2.0, log)
    assert "prefill batches 3, requests 1 and new tokens 1500 per batch" in line
    assert "running batch median 3, max 4" in line
    assert "decode step 15.0 ms" in line  # 4 / 400 and 2 / 100 s per step: 10 and 20 ms
    assert "forward p50 0.100 s" in line and "queue p50 0.010 s" in line


@pytest.fixture
def served(monkeypatch):
    """eval.experiments.run.serve on a fake server; run_point checked against eval.experiments.run's signature. Yields what ran."""
    # eval.experiments.overload, then eval.experiments.scheduler_profile, once called run_point with an older signature and broke unnoticed.
    started = []

    class Server:
        def __init__(self, model, *flags, **kwargs):
            started.append(flags)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def log(self):
            return "before\n" if not started[1:] else "before\nafter\n"

    def fake_run_point(*args, **kwargs):
        inspect.signature(run.run_point).bind(*args, **kwargs)  # raises on a stale call
        started.append("ran")
        return [([1], "a", {}, 0.1, 0.2, 0.0)], None, None, 1.5, {}

    monkeypatch.setattr(run, "ServerProcess", Server)  # eval.experiments.run.serve starts every eval server
    monkeypatch.setattr(run, "pool_pages", lambda server, page_size: 1024)
    for script in (overload, scheduler_profile):
        monkeypatch.setattr(script, "run_point", fake_run_point)
    yield started
    assert started[1] == "ran" and "--decode-log-interval" in started[0]
    assert "--mepic-host-tier-gb" in started[0]  # the sweeps' host tier, so the runs cannot drift from them


def test_measure_serves_as_eval_run_does(served):
    outputs, seconds, log = overload.measure("mepic", "m", ["--x"], {}, ["t"], 4.0)
    assert seconds == 1.5 and len(outputs) == 1 and log == "after\n"  # only what the run logged


def test_profile_serves_as_eval_run_does(served, monkeypatch):
    class Spy:
        summary = "Samples: 0"

        def __init__(self, *args):
            pass

        def start(self):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(scheduler_profile, "PySpy", Spy)
    monkeypatch.setattr(scheduler_profile, "scheduler_pid", lambda server: 1)
    result = scheduler_profile.profile("mepic", "m", ["--x"], {}, ["t"], 4.0, 16, None, 100, tqdm(disable=True))
    assert result == (1.5, "Samples: 0")


def test_variants_take_full_apart():
    assert set(overload.VARIANTS) == {"vanilla-page16", "mepic-attention"}
    assert "--page-size" in overload.VARIANTS["vanilla-page16"]
    assert overload.VARIANTS["mepic-attention"][:2] == ["--attention-backend", "mepic"]


def test_every_position_independent_system_gets_the_same_host_tier():
    from eval.experiments.run import PIC, SYSTEMS, tiered

    for system in SYSTEMS:
        flags, tier = tiered(system, SYSTEMS[system], 1.0)
        assert (tier, flags[-2:] == ["--mepic-host-tier-gb", "1"]) == ((1.0, True) if system in PIC else (0.0, False))
    assert tiered("mepic", SYSTEMS["mepic"], 0.0) == (SYSTEMS["mepic"], 0.0)
