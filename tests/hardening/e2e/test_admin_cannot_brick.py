"""Admin calls and faults that left the server failing every request while `/health` said 200 (issue 85.2),
and `/health`'s one-second floor (85.5): found by the battery at 1410689."""

import statistics
import time

import pytest
import requests

from sglang_mepic.hardening.batch_guard import FAULT_ENV, PERSISTENT_FAULT_BATCHES
from sglang_mepic.process.server_process import ServerProcess

pytestmark = pytest.mark.server
GREEDY = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}


def generate(server, rid=None):
    body = {"text": "The quick brown fox", "sampling_params": GREEDY, **({"rid": rid} if rid else {})}
    return requests.post(server.url + "/generate", json=body, timeout=120)


def serves(server) -> bool:
    r = generate(server)
    return r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize("body, said", [
    ({"output_dir": "/proc/no/such/dir", "num_steps": 1}, "traces cannot be written there"),
    ({"activities": ["NOPE"]}, "activities ['NOPE']: this server records CPU, GPU"),
    ({"activities": []}, "activities: a non-empty list"),
    ({"num_steps": -2}, "num_steps -2"),
], ids=["unwritable-dir", "unknown-activity", "no-activity", "negative-steps"])
def test_a_profile_that_cannot_work_is_refused_before_anything_changes(tiny_server, body, said):
    """The unwritable directory was a 200, then every later request a 500 (FileNotFoundError in the stop
    step, in every batch); unknown activities stalled the next admin call past 300 s."""
    r = requests.post(tiny_server.url + "/start_profile", json=body, timeout=60)
    assert r.status_code == 400 and said in r.text, (r.status_code, r.text)
    assert serves(tiny_server) and serves(tiny_server)
    r = requests.post(tiny_server.url + "/stop_profile", timeout=30)  # nothing was started
    assert r.status_code == 400 and "not in progress" in r.text.lower(), r.text


def test_a_profile_step_that_fails_ends_the_profile_and_the_server_serves_on(tiny_server, tmp_path):
    """A directory that is writable at the start and gone when the trace is saved: the stop step raises in
    run_batch. It ended that batch's requests and every later one's; now it ends only the profile."""
    traces = tmp_path / "traces"
    r = requests.post(tiny_server.url + "/start_profile", json={"output_dir": str(traces), "num_steps": 1,
                                                                "activities": ["CPU"]}, timeout=60)
    assert r.status_code == 200, r.text
    traces.rmdir()
    traces.write_text("a file where the trace folder was")  # mkdir(exist_ok=True) raises FileExistsError
    for _ in range(4):
        assert serves(tiny_server)
    r = requests.post(tiny_server.url + "/stop_profile", timeout=30)
    assert r.status_code == 400 and "not in progress" in r.text.lower(), r.text  # abandoned, not running
    assert requests.get(tiny_server.url + "/health", timeout=30).status_code == 200


def test_a_profile_that_works_still_writes_its_trace(tiny_server, tmp_path):
    r = requests.post(tiny_server.url + "/start_profile", json={"output_dir": str(tmp_path), "num_steps": 1,
                                                                "activities": ["CPU"]}, timeout=60)
    assert r.status_code == 200, r.text
    for _ in range(3):
        assert serves(tiny_server)
    deadline = time.monotonic() + 60
    while not list(tmp_path.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert list(tmp_path.iterdir()), "no trace written"


def test_health_answers_as_fast_as_ready(tiny_server):
    """SGLang's handler slept 1 s before it first looked: 1.003 s at least, on plain SGLang too."""
    for path in ("/health", "/health_generate"):
        times = []
        for _ in range(5):
            start = time.monotonic()
            assert requests.get(tiny_server.url + path, timeout=30).status_code == 200
            times.append(time.monotonic() - start)
        assert statistics.median(times) < 0.25, (path, times)


def test_a_fault_in_every_batch_ends_the_server_rather_than_leaving_a_zombie(tiny_model):
    """Each batch holding a request whose rid starts with `boom` raises. One such batch ends its requests and
    the server serves on; PERSISTENT_FAULT_BATCHES of them in a row, none served between, is a broken
    process: the server exits, for its supervisor to restart, instead of failing every request while
    `/health` answers 200."""
    with ServerProcess(tiny_model, "--dtype", "float32", env={FAULT_ENV: "boom"}) as server:
        assert generate(server, rid="boom-0").status_code == 500
        assert serves(server)  # a batch served between: the count starts again
        for i in range(PERSISTENT_FAULT_BATCHES - 1):
            assert generate(server, rid=f"boom-{i + 1}").status_code == 500
        assert server.proc.poll() is None and serves(server), "exited before the streak was long enough"
        for i in range(PERSISTENT_FAULT_BATCHES):
            try:
                generate(server, rid=f"boom-again-{i}")
            except requests.RequestException:
                break  # the server went while this request waited
        deadline = time.monotonic() + 90
        while server.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.proc.poll() is not None, "the server serves on, failing every batch"
