"""Start and stop Mooncake Store's master on loopback (launch_cluster, tests).

    with MooncakeMaster() as master:
        ... --mepic-storage-backend mooncake --mepic-storage-config json.dumps(master.storage_config())

`mooncake_master` comes with the PyPI wheel `mooncake-transfer-engine-non-cuda`
(its shared libraries need Debian's `libibverbs1`). It runs with its HTTP
metadata server, so nothing else (etcd) is needed. The objects themselves live
in the memory each client contributes (`global_segment_size`), not in the
master: an instance that stops takes its share with it, and a master that
restarts has forgotten every object.
"""

import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sglang_mepic.process.server_process import HOST, die_with_parent, free_port

INSTALL_HINT = ("install the Mooncake wheel (`make venv` does: mooncake-transfer-engine-non-cuda in "
                "requirements/cpu.lock) and Debian's libibverbs1 (`apt-get install libibverbs1`)")


class MasterError(RuntimeError):
    pass


def executable() -> str:
    found = shutil.which("mooncake_master", path=str(Path(sys.executable).parent)) or shutil.which("mooncake_master")
    if found is None:
        raise MasterError(f"mooncake_master not found: {INSTALL_HINT}")
    return found


def check_client() -> None:
    """Raise MasterError, saying what to install, when the Mooncake client cannot load."""
    try:
        from mooncake.store import MooncakeDistributedStore  # noqa: F401
    except ImportError as e:
        raise MasterError(f"the Mooncake client cannot be imported ({e}): {INSTALL_HINT}") from None


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


class MooncakeMaster:
    def __init__(self, rpc_port: int | None = None, http_port: int | None = None, segment: int = 512 << 20,
                 startup_timeout: float = 30.0):
        self.rpc_port = rpc_port or free_port()
        self.http_port = http_port or free_port()
        self.metrics_port = free_port()
        self.segment = segment  # bytes each instance contributes to the store
        self.startup_timeout = startup_timeout
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None

    def storage_config(self) -> dict:
        """`--mepic-storage-config` for an instance on this machine (SGLang's Mooncake extra_config)."""
        return {"master_server_address": f"{HOST}:{self.rpc_port}",
                "metadata_server": f"http://{HOST}:{self.http_port}/metadata",
                "protocol": "tcp", "device_name": "", "local_hostname": HOST,
                "global_segment_size": self.segment, "master_metrics_port": self.metrics_port}

    def start(self) -> "MooncakeMaster":
        fd, log = tempfile.mkstemp(prefix=f"mooncake-master-{self.rpc_port}-", suffix=".log")
        self.log_path = Path(log)
        cmd = [executable(), f"--rpc_address={HOST}", f"--rpc_port={self.rpc_port}",
               "--enable_http_metadata_server=true", f"--http_metadata_server_host={HOST}",
               f"--http_metadata_server_port={self.http_port}", f"--metrics_port={self.metrics_port}"]
        self.proc = subprocess.Popen(cmd, stdout=fd, stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=die_with_parent)
        deadline = time.monotonic() + self.startup_timeout
        while not (_listening(self.rpc_port) and _listening(self.http_port)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise MasterError(f"mooncake_master did not start:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "MooncakeMaster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
