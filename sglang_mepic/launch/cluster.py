"""Several sglang-mepic servers on this machine behind sglang-router, sharing chunk KV.

    python -m sglang_mepic.launch_cluster --instances 2 [--storage mooncake|file|none]
        [--policy cache_aware] [--host 127.0.0.1] [--port 30000] [...launch_server flags]

Starts, in order:
- Mooncake Store's master with its HTTP metadata server (`--storage mooncake`,
  the default), on free loopback ports;
- N servers (`python -m sglang_mepic.launch_server`) on free loopback ports,
  each with the shared chunk tier: `--mepic-storage-backend mooncake` and the
  master's address, or `--mepic-storage-dir` (`--storage file`), or none;
- sglang-router on --host:--port in front of them, with --policy.

Each server gets an equal share of this machine's cores for its CPU threads
(OMP_NUM_THREADS, unless set; --threads-per-instance overrides): N servers that
each spin a thread per core oversubscribe the machine. Every other flag goes to
each server. Ctrl-C, SIGTERM, or any part exiting
stops them all; each part's log is a file named at start. Everything here runs
on one machine over loopback TCP; docs/scale-out.md ("More than one machine")
says what a multi-host deployment changes.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from sglang_mepic.process.mooncake_master import MooncakeMaster
from sglang_mepic.process.server_process import HOST, ServerError, ServerProcess, die_with_parent, free_port

POLICIES = ("cache_aware", "round_robin", "power_of_two", "random", "manual")
STORAGE = ("mooncake", "file", "none")


def share_of_cores(instances: int) -> int | None:
    """Each instance's CPU threads: an equal share of the cores, or None where OMP_NUM_THREADS is set.

    Every server process otherwise runs a torch thread per core. Two of them on two cores,
    without a shared tier, served 100 requests of eval.experiments.load in 43.6 s, against 5.4 s with
    one thread each."""
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, len(os.sched_getaffinity(0)) // instances)


class Cluster:
    def __init__(self, model_path: str, instances: int = 2, storage: str = "mooncake", policy: str = "cache_aware",
                 port: int | None = None, host: str = HOST, server_args: tuple = (), storage_dir: str | None = None,
                 segment: int = 512 << 20, router_args: tuple = (), startup_timeout: float = 600.0,
                 threads: int | None = None):
        if instances < 1:
            raise ValueError("--instances must be at least 1")
        if storage not in STORAGE or policy not in POLICIES:
            raise ValueError(f"--storage {storage} ({', '.join(STORAGE)}), --policy {policy} ({', '.join(POLICIES)})")
        if threads is not None and threads < 1:
            raise ValueError("--threads-per-instance must be at least 1")
        if storage == "file" and not storage_dir:
            raise ValueError("--storage file needs --storage-dir DIR")
        self.model_path, self.instances, self.storage, self.policy = model_path, instances, storage, policy
        self.host, self.port = host, port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.server_args, self.router_args = list(server_args), list(router_args)
        self.storage_dir, self.segment, self.startup_timeout = storage_dir, segment, startup_timeout
        self.threads = threads or share_of_cores(instances)
        self.master: MooncakeMaster | None = None
        self.servers: list[ServerProcess] = []
        self.router: subprocess.Popen | None = None
        self.router_log: Path | None = None

    def storage_args(self) -> list[str]:
        if self.storage == "mooncake":
            assert self.master is not None, "start() starts the master before the servers"
            return ["--mepic-storage-backend", "mooncake",
                    "--mepic-storage-config", json.dumps(self.master.storage_config())]
        if self.storage == "file":
            assert self.storage_dir, "__init__ refuses file storage without a folder"
            return ["--mepic-storage-dir", self.storage_dir]
        return []

    def start(self) -> "Cluster":
        try:
            if self.storage == "mooncake":
                self.master = MooncakeMaster(segment=self.segment).start()
            env = {"OMP_NUM_THREADS": str(self.threads)} if self.threads else None
            self.servers = [ServerProcess(self.model_path, *self.server_args, *self.storage_args(),
                                          startup_timeout=self.startup_timeout, env=env)
                            for _ in range(self.instances)]
            for server in self.servers:  # launched from this thread, which outlives them (PDEATHSIG)
                server.launch()
            with ThreadPoolExecutor(self.instances) as pool:  # imports dominate a start: they overlap
                list(pool.map(ServerProcess.wait_ready, self.servers))
            self._start_router()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_router(self) -> None:
        fd, log = tempfile.mkstemp(prefix=f"sglang-router-{self.port}-", suffix=".log")
        self.router_log = Path(log)
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", self.host, "--port", str(self.port),
               "--policy", self.policy, "--worker-urls", *[s.url for s in self.servers], *self.router_args]
        self.router = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, start_new_session=True,
                                       preexec_fn=die_with_parent)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.router.poll() is not None:
                raise ServerError(f"sglang-router exited with code {self.router.returncode}:\n{self._router_tail()}")
            try:
                # Its /health answers before its first health checks of the workers have passed, and
                # until then it refuses requests (503, no available workers): wait for a real answer.
                ping = requests.post(self.url + "/generate", timeout=60,
                                     json={"text": "ready?", "sampling_params": {"max_new_tokens": 1}})
                if ping.status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise ServerError(f"sglang-router not ready after 120 s:\n{self._router_tail()}")

    def _router_tail(self, lines: int = 30) -> str:
        text = self.router_log.read_text(errors="replace") if self.router_log else ""
        return "\n".join(text.splitlines()[-lines:])

    def exited(self) -> str | None:
        """Which part has exited, if any."""
        if self.router is not None and self.router.poll() is not None:
            return f"sglang-router (code {self.router.returncode})"
        for i, s in enumerate(self.servers):
            if s.proc is not None and s.proc.poll() is not None:
                return f"instance {i} at {s.url} (code {s.proc.returncode})"
        if self.master is not None and self.master.proc is not None and self.master.proc.poll() is not None:
            return f"mooncake_master (code {self.master.proc.returncode})"
        return None

    def stop(self) -> None:
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            try:
                self.router.wait(10)
            except subprocess.TimeoutExpired:
                self.router.kill()
                self.router.wait()
        if self.servers:
            with ThreadPoolExecutor(len(self.servers)) as pool:
                list(pool.map(ServerProcess.stop, self.servers))
        if self.master is not None:
            self.master.stop()

    def describe(self) -> str:
        parts = [f"router {self.url} ({self.policy}), log {self.router_log}"]
        if self.threads:
            parts.append(f"{self.threads} CPU thread(s) per instance")
        parts += [f"instance {i}: {s.url}, log {s.log_path}" for i, s in enumerate(self.servers)]
        if self.master is not None:
            parts.append(f"mooncake_master {self.master.storage_config()['master_server_address']}, "
                         f"log {self.master.log_path}")
        return "\n".join(parts)

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m sglang_mepic.launch_cluster", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0],
                                epilog="Any other flag is passed to every server (launch_server's and SGLang's).")
    p.add_argument("--instances", type=int, default=2, help="servers to start. Default: 2.")
    p.add_argument("--storage", choices=STORAGE, default="mooncake",
                   help="the shared chunk tier: Mooncake Store (a master is started), a directory, or none. "
                        "Default: mooncake.")
    p.add_argument("--storage-dir", default=None, help="the directory of --storage file")
    p.add_argument("--segment-mb", type=int, default=512,
                   help="memory each instance gives Mooncake Store for chunk KV, in MiB. Default: 512.")
    p.add_argument("--policy", choices=POLICIES, default="cache_aware",
                   help="sglang-router's routing policy. Default: cache_aware.")
    p.add_argument("--host", default=HOST, help=f"the router's address. Default: {HOST}.")
    p.add_argument("--port", type=int, default=30000, help="the router's port. Default: 30000.")
    p.add_argument("--threads-per-instance", type=int, default=None,
                   help="CPU threads of each server (OMP_NUM_THREADS). Default: OMP_NUM_THREADS if set, "
                        "else this machine's cores divided by --instances.")
    p.add_argument("--model-path", "--model", default=None, help="default: launch_server's default model")
    return p


def main(argv: list[str] | None = None) -> None:
    args, server_args = parser().parse_known_args(argv)
    from sglang_mepic.launch import models
    from sglang_mepic.launch.checks import check_port_free

    model = args.model_path or str(models.build(models.DEFAULT_MODEL))
    check_port_free(args.host, args.port)
    try:
        cluster = Cluster(model, args.instances, args.storage, args.policy, args.port, args.host, tuple(server_args),
                          args.storage_dir, args.segment_mb << 20, threads=args.threads_per_instance)
    except ValueError as e:
        sys.exit(f"launch_cluster: error: {e}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"[cluster] starting {args.instances} instance(s), storage {args.storage} ...", flush=True)
    started = time.monotonic()
    with cluster:
        print(f"[cluster] ready in {time.monotonic() - started:.0f} s:\n{cluster.describe()}", flush=True)
        try:
            while (gone := cluster.exited()) is None:
                time.sleep(1)
        except KeyboardInterrupt:
            print("[cluster] stopping", flush=True)
            return
        print(f"[cluster] {gone} exited: stopping the rest", flush=True)
    sys.exit(1)


if __name__ == "__main__":
    main()
