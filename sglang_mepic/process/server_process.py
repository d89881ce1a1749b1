"""Start and stop a real sglang-mepic server on a free loopback port.

Used by the end-to-end tests and the evaluation scripts:

    with ServerProcess(model_path, "--dtype", "float32") as server:
        requests.post(server.url + "/generate", json=...)

The server runs in its own process group, so stopping it also stops the
scheduler and detokenizer processes SGLang spawns. On Linux it is also killed
when the process that started it dies, however that dies (SGLang's own
processes die with it), so a killed test run or evaluation leaves no server.

Where `SGLANG_MEPIC_FORK_SERVER` names the socket of a running `sglang_mepic.launch.fork_server` (the
test suite starts one), the server is forked from that process, which has imported SGLang already: a
tiny-model server answers in about 8 s instead of 26 on 2 cores. It is stopped and polled the same way.
A server whose environment the fork server cannot honour starts cold, and its log's first line says why.
"""

import json
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
FORK_SERVER_ENV = "SGLANG_MEPIC_FORK_SERVER"
# A port taken before the server bound it: the launcher's check ("cannot listen on ...: Address already in use"),
# or, taken after that check, uvicorn's bind (it then waits for the scheduler to shut down, which it may never
# do). The start is retried on another port.
BIND_FAILED = ("Address already in use", "error while attempting to bind on address")
PORT_ATTEMPTS = 3
FORK_SERVER_WAIT_S = 120.0  # a fork server still importing SGLang (about 20 s) is waited for


def die_with_parent() -> None:
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


class ForkedProcess:
    """A server forked by the fork server: `subprocess.Popen`'s pid, poll, wait, send_signal and returncode.
    Its parent is the fork server, which writes its exit status to `exit_path` when it ends."""

    def __init__(self, pid: int, exit_path: Path):
        self.pid, self.exit_path = pid, exit_path
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and self.exit_path.exists():
            self.returncode = int(self.exit_path.read_text())
        elif self.returncode is None and not process_exists(self.pid):
            time.sleep(0.3)  # reaped, its status on the way; none comes if the fork server died too
            self.returncode = int(self.exit_path.read_text()) if self.exit_path.exists() else -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked server {self.pid}", timeout or 0.0)
            time.sleep(0.05)
        assert self.returncode is not None  # poll() returned it
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def fork_server_socket() -> str | None:
    """The fork server's socket, once it accepts (it appears when SGLang is imported); None without one."""
    path = os.environ.get(FORK_SERVER_ENV)
    if not path:
        return None
    deadline = time.monotonic() + FORK_SERVER_WAIT_S
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.2)
    return path if os.path.exists(path) else None


class ServerProcess:
    def __init__(self, model_path: str | os.PathLike, *args: str, port: int | None = None,
                 startup_timeout: float = 900.0, env: dict[str, str] | None = None):
        self.model_path = str(model_path)
        self.args = list(args)
        self.port = port or free_port()
        self.port_chosen = port is None  # a port it chose itself it may choose again (wait_ready)
        self.url = f"http://{HOST}:{self.port}"
        self.startup_timeout = startup_timeout
        # A test session may run Triton under the interpreter; a server never should
        # (SGLang's own kernels would crawl), unless asked to explicitly.
        inherited = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.env = {**inherited, **(env or {})}
        self.proc: subprocess.Popen | ForkedProcess | None = None
        self._stopped = False
        self.log_path: Path | None = None
        self.forked = False  # started by the fork server
        self.cold_because: str | None = None  # why a fork server there was not used

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
        if (forked := self._fork(cmd[3:])) is not None:
            os.close(fd)
            self.proc, self.forked = forked, True
            return
        if self.cold_because:  # the first line of its log says why it did not come from the fork server
            os.write(fd, f"sglang-mepic: started cold, not forked: {self.cold_because}\n".encode())
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, env=self.env,
                                     start_new_session=True, cwd=tempfile.gettempdir(),
                                     preexec_fn=die_with_parent)
        os.close(fd)

    def _fork(self, argv: list[str]) -> ForkedProcess | None:
        """Ask the fork server for this server; None (start it cold) without one, or if it declines."""
        path = fork_server_socket()
        if path is None:
            return None
        exit_path = Path(f"{self.log_path}.exit")
        request = {"argv": argv, "env": self.env, "log": str(self.log_path), "exit": str(exit_path),
                   "cwd": tempfile.gettempdir(), "client": os.getpid()}
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(60)
                s.connect(path)
                s.sendall((json.dumps(request) + "\n").encode())
                reply = json.loads(s.makefile("r").readline() or "{}")
        except (OSError, ValueError) as e:
            reply = {"cold": f"the fork server did not answer: {e}"}
        if "pid" not in reply:
            self.cold_because = reply.get("cold") or reply.get("error") or "no reply"
            return None
        return ForkedProcess(int(reply["pid"]), exit_path)

    def wait_ready(self) -> None:
        """Wait until the server answers /health. A port it chose that was taken before the server bound it
        (servers started together pick their own ports for SGLang's internal sockets) is not waited out:
        the server is stopped and started again on another port, up to PORT_ATTEMPTS times. A port the
        caller gave is its to keep: taken, it is an error at once."""
        for _ in range(PORT_ATTEMPTS):
            if self._wait_ready():
                return
            if not self.port_chosen:
                raise ServerError(f"port {self.port} is taken:\n{self.log_tail()}")
            taken = self.port
            self.stop()
            self.port = free_port()
            self.url = f"http://{HOST}:{self.port}"
            print(f"sglang-mepic: port {taken} was taken before the server bound it; again on {self.port}",
                  file=sys.stderr, flush=True)
            self.launch()
        raise ServerError(f"no free port held after {PORT_ATTEMPTS} starts:\n{self.log_tail()}")

    def _wait_ready(self) -> bool:
        """True once /health answers 200; False if the HTTP server could not bind its port."""
        assert self.proc is not None, "launch() starts it first"
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._port_taken():
                    return False
                raise ServerError(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            if self._port_taken():  # uvicorn gave up, the process lingers: whatever answers there is not it
                return False
            try:
                if requests.get(self.url + "/health", timeout=5).status_code == 200:
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(f"server not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}")

    def _port_taken(self) -> bool:
        log = self.log()
        return any(mark in log for mark in BIND_FAILED)

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
