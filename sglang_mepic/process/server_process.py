"""Start and stop a real sglang-mepic server on a free loopback port.

Used by the end-to-end tests and the evaluation scripts:

    with ServerProcess(model_path, "--dtype", "float32") as server:
        requests.post(server.url + "/generate", json=...)

The server runs in its own process group, so stopping it also stops the
scheduler and detokenizer processes SGLang spawns. On Linux it is also killed
when the process that started it dies, however that dies (SGLang's own
processes die with it), so a killed test run or evaluation leaves no server.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

HOST = "127.0.0.1"


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux for SIGKILL when the parent dies."""
    if sys.platform == "linux":
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    pass


class ServerProcess:
    def __init__(self, model_path: str | os.PathLike, *args: str, port: int | None = None,
                 startup_timeout: float = 900.0, env: dict[str, str] | None = None):
        self.model_path = str(model_path)
        self.args = list(args)
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.startup_timeout = startup_timeout
        # A test session may run Triton under the interpreter; a server never should
        # (SGLang's own kernels would crawl), unless asked to explicitly.
        inherited = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.env = {**inherited, **(env or {})}
        self.proc: subprocess.Popen | None = None
        self._stopped = False
        self.log_path: Path | None = None

    def start(self) -> "ServerProcess":
        self.launch()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> None:
        """Start the process without waiting for it. Call it from the thread that outlives the
        server: Linux sends the parent-death signal when the launching *thread* exits."""
        fd, log = tempfile.mkstemp(prefix=f"sglang-mepic-{self.port}-", suffix=".log")
        self.log_path = Path(log)
        cmd = [sys.executable, "-m", "sglang_mepic.launch_server", "--model-path", self.model_path,
               "--host", HOST, "--port", str(self.port), *self.args]
        self._stopped = False
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True, cwd=tempfile.gettempdir(),
                                     preexec_fn=_die_with_parent)
        os.close(fd)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(f"server not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def terminate(self) -> None:
        """Ask the server to shut down (SGLang drains its requests, which takes seconds) without waiting."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: the group's id is its pid
            except ProcessLookupError:
                pass

    def stop(self, drain: float = 0.0) -> None:
        """Stop the server and every process it started. By default at once: a SIGTERM makes SGLang drain
        its requests and wait about 5 s even when it has none (6 s per server that the tests and the
        evaluations started, minutes in all), and what a stopped test or evaluation server had in flight
        is not wanted. `drain` seconds of SIGTERM first lets requests finish."""
        if self.proc is None or self._stopped:
            return  # stopped once: its group id may since belong to another process
        if drain > 0 and self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(drain)
            except subprocess.TimeoutExpired:
                pass
        # SGLang's children may outlive the main process; clear the whole group.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        self._stopped = True

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
