"""The launcher run to its exit, and what a refusal must look like: shared by tests/launch/test_launch.py
(the launcher's `main` in the test process) and tests/launch/e2e/test_launcher_refusals_server.py (the
launcher as a server process)."""

import subprocess


def launch_to_exit(model: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The launcher as a ServerProcess starts it (forked from the fork server where the session has one: its
    18 s of imports paid once), run until it exits; stdout and stderr are its log, both."""
    from sglang_mepic.process.server_process import ServerProcess

    server = ServerProcess(model, *args)
    server.launch()
    try:
        code = server.proc.wait(timeout)
    finally:
        server.stop()
    log = "".join(line for line in server.log().splitlines(keepends=True)  # the first line is ServerProcess's
                  if not line.startswith("sglang-mepic: started cold, not forked:"))
    return subprocess.CompletedProcess(["launch_server", *args], code, log, log)


def assert_refused(out: subprocess.CompletedProcess, reason: str) -> None:
    """Exit status 2 and one line on stderr, the reason: no traceback, no usage block, nothing loaded."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr + out.stdout
    assert len(lines) == 1 and lines[0].startswith("sglang_mepic.launch_server: error: ") and reason in lines[0], \
        out.stderr[-2000:]
