"""Servers forked from the test session's fork server (sglang_mepic/launch/fork_server.py, started by
tests/conftest.py) serve what a cold `python -m sglang_mepic.launch_server` serves, report their exit
status, and die with the process that asked for them."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_mepic.process.server_process import (FORK_SERVER_ENV, ServerError, ServerProcess, fork_server_socket,
                                                  process_exists)


@pytest.fixture(autouse=True)
def forking(fork_server):
    if fork_server is None or os.environ.get(FORK_SERVER_ENV) != fork_server:
        pytest.skip("the session runs no fork server of its own (SGLANG_MEPIC_TEST_COLD=1)")


def test_a_forked_server_serves_what_a_cold_one_serves(tiny_model, run_prompt_set, servers, fork_server):
    """`python -m sglang_mepic.launch.fork_server SOCKET`, as tests/conftest.py starts it, forks the server."""
    servers.stop_all()  # two servers at once, beside none of the shared ones
    assert fork_server_socket() == fork_server  # waits for its imports (the first server of a session)
    assert f"serving on {fork_server}" in (Path(fork_server).parent / "log").read_text()
    assert os.stat(fork_server).st_mode & 0o777 == 0o600  # only its owner may have servers started
    # A variable that some module might read at import: the fork server declines, and the server starts cold.
    with ServerProcess(tiny_model, "--dtype", "float32", env={"SGLANG_MEPIC_TEST_UNREAD": "1",
                                                                "FORK_SERVER_PROBE": "1"}) as cold:
        assert not cold.forked and "FORK_SERVER_PROBE" in cold.cold_because
        assert cold.log().startswith("sglang-mepic: started cold, not forked: FORK_SERVER_PROBE")
        cold_outputs = run_prompt_set(cold)
    with ServerProcess(tiny_model, "--dtype", "float32", env={"SGLANG_MEPIC_TEST_UNREAD": "1"}) as warm:
        assert warm.forked and warm.cold_because is None
        assert run_prompt_set(warm) == cold_outputs
        assert warm.proc.poll() is None
        pid = warm.proc.pid
    assert warm.proc.returncode is not None and not process_exists(pid)


def test_a_forked_launcher_that_refuses_reports_its_exit_status(tiny_model):
    server = ServerProcess(tiny_model, "--page-size", "0")
    with pytest.raises(ServerError, match="exited with code 2"):
        server.start()
    assert server.forked
    assert "--page-size" in server.log()


CLIENT = """
import sys, time
from sglang_mepic.process.server_process import ServerProcess
server = ServerProcess(sys.argv[1], "--dtype", "float32").start()
print(server.proc.pid, server.forked, flush=True)
time.sleep(600)
"""


def test_a_forked_server_dies_with_the_process_that_asked_for_it(tiny_model, servers):
    servers.stop_all()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, tiny_model], stdout=subprocess.PIPE, text=True,
                              env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    try:
        pid, forked = client.stdout.readline().split()
        assert forked == "True" and process_exists(int(pid))
    finally:
        client.kill()
        client.wait()
    deadline = time.monotonic() + 10
    while process_exists(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not process_exists(int(pid)), "the server outlived its client"
