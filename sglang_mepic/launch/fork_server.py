"""A launcher that has imported SGLang once and forks servers from there: CPU test and eval runs only.

    python -m sglang_mepic.launch.fork_server /tmp/x.sock    # then ServerProcess asks it, through
    SGLANG_MEPIC_FORK_SERVER=/tmp/x.sock                     # this variable, to start each server

On 2 cores a server spends about 18 of its 26 s to /health importing SGLang, torch and transformers
before its first log line, and the test suite starts about 70 servers. Forked from this process, which
paid the imports once (and applied SGLang's plugin hooks), a tiny-model server answers in about 5-6 s.
The child runs the launcher's own `main` with the server's argv and environment, so what it serves is
what `python -m sglang_mepic.launch_server` serves; SGLang's scheduler and detokenizer are then forked
from it as usual on CPU (sglang_mepic/patches/launcher/engine_set_envs_and_config.py).

What keeps a fork honest:
- This process runs no Python thread but its main one and never computes (no OpenMP pool to inherit): it
  only imports, and applies the plugins' hooks (`preload`).
- A module may read the environment when it is imported, so a server is forked only when its
  environment equals this process's but for variables read at run time (`RUNTIME_PREFIXES`,
  `RUNTIME_NAMES`) and the OpenMP thread count, which the child sets; any other difference gets a cold
  start, and the reply says which variable.
- A child starts its own session (the client stops it by its process group, as it stops a cold one),
  dies with this process (parent-death signal), and is killed when the process that asked for it
  is gone, as a cold server dies with its parent.
- Each child's exit status is written where the client asked (beside its log), and its `poll` reads it.

Never on a GPU: a CUDA context does not survive a fork (the server refuses to start here). Whoever can
connect to the socket starts processes as this user, with the argv and environment it sends: the
socket is made readable and writable by its owner only (tests/conftest.py also puts it in pytest's
private temporary folder).
"""

import json
import os
import signal
import socket
import sys
import time
import traceback

from sglang_mepic.process.server_process import FORK_SERVER_ENV, die_with_parent, process_exists

# Read when a request is served, never at import: a server may set them differently from this process.
# Besides the package's own and pytest's, the compiler caches' folders (SGLang points them under its
# cache folder with setdefault; a test process that ran torch's inductor has its own default set).
RUNTIME_PREFIXES = ("SGLANG_MEPIC_", "MEPIC_", "PYTEST_", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "CUDA_CACHE_PATH",
                    "TILELANG_CACHE_DIR")
# Never read at import: the shell's bookkeeping (a server started from a script), the terminal's size (read
# when a line is printed), and what SGLang 0.5.23 reads in a function the launch or the first forward calls
# (`envs.X.get()` reads os.environ each time; the fused-op backend is resolved on first use, which
# `runtime_names` checks after the imports): the GPU run's servers (eval/gpu/e2e) set those three.
RUNTIME_NAMES = frozenset({"SHLVL", "_", "PWD", "OLDPWD", "COLUMNS", "LINES", "SGLANG_FORCE_FUSED_OP_BACKEND",
                           "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"})
# OMP_NUM_THREADS is not among them: OpenMP reads it when libgomp loads, so a forked child would keep this
# process's count, and setting it in the child (torch.set_num_threads) is no cold start either: it makes
# torch's thread pool in the launcher, which then forks the scheduler, where torch replaces that pool on the
# first parallel op of each new thread; two threads doing so at once can find none ("Invalid thread pool!": a
# prefetch worker's storage read of a launch_cluster instance failed, tests/launch/e2e/test_cluster.py,
# 2026-11-30). A server whose thread count differs starts cold (launch_cluster's instances).
# Python reads it when it starts: the child rebuilds its stdout and stderr as `python -u` would have them.
UNBUFFERED = "PYTHONUNBUFFERED"
# What a server imports after its first log line, imported here once.
PRELOAD = (
    "sglang_mepic.launch.server",
    "sglang_mepic.plugin",
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.models.llama",
    "sglang.srt.models.registry",  # every model module SGLang has, scanned when a model loads: 2.3 s a server
    "sglang.srt.managers.tp_worker",
    "sglang.srt.constrained.xgrammar_backend",
    "sglang_mepic.cache.cache_backend",
    "sglang_mepic.attention.backend",
    "sglang_mepic.frontend.ids_and_hint",
    # Not prometheus_client: it reads PROMETHEUS_MULTIPROC_DIR when imported, which SGLang sets before that.
)
POLL_S = 0.1  # how soon an exit or a gone client is seen


FUSED_OP_BACKEND = "SGLANG_FORCE_FUSED_OP_BACKEND"


def runtime_names() -> frozenset[str]:
    """RUNTIME_NAMES, less the fused-op backend's variable where an import has resolved that backend already:
    every child would keep this process's."""
    fused_op = sys.modules.get("sglang.kernels.fused_op")
    if fused_op is not None and getattr(fused_op, "_forced_backend", None) is not getattr(fused_op, "_UNRESOLVED", None):
        return RUNTIME_NAMES - {FUSED_OP_BACKEND}
    return RUNTIME_NAMES


def env_difference(env: dict[str, str], before: dict[str, str], after: dict[str, str],
                   late: frozenset[str] = RUNTIME_NAMES) -> str | None:
    """The first variable that a module may read at import and that `env` sets otherwise than this process
    had it before its imports (`before`) or has it after them (`after`: SGLang's imports set some with
    setdefault, the cache folders); None if there is none. `late`: the names read only after the imports."""
    for key in sorted(set(env) | set(before) | set(after)):
        if key.startswith(RUNTIME_PREFIXES) or key in late:
            continue
        if key == UNBUFFERED:
            continue
        if env.get(key) not in (before.get(key), after.get(key)):
            return key
    return None


def set_buffering(env: dict[str, str]) -> None:
    """In the child, once fds 1 and 2 are its log: unbuffered where `env` asks, as `python -u` starts."""
    import io

    if env.get(UNBUFFERED):
        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "wb", closefd=False), encoding=old.encoding,
                                                errors=old.errors, write_through=True))


def child_env(env: dict[str, str], before: dict[str, str], after: dict[str, str]) -> dict[str, str]:
    """`env` with what this process's imports changed, where `env` has it as before them: what the
    child's environment would be had it imported SGLang itself."""
    out = dict(env)
    for key in set(before) | set(after):
        if before.get(key) != after.get(key) and env.get(key) == before.get(key):
            if key in after:
                out[key] = after[key]
            else:
                out.pop(key, None)
    return out


def preload() -> str | None:
    """Import what a server imports, and load SGLang's plugins: their hooks are applied once here, not in
    every child (SGLang walks every loaded module for each of the 39 hooks: about 3 s a server). Loading
    them reads nothing a server sets: the plugin's log filters come from the launcher's `main`, in the
    child. Returns why children cannot be forked, or None."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    from sglang.srt.plugins import load_plugins

    from sglang_mepic import plugin

    load_plugins()
    if not plugin._registered:  # a cold start logs the plugin's error where the server's log shows it
        return "the sglang-mepic plugin did not register in the fork server"
    return None


def _run_server(request: dict) -> None:
    """In the forked child: become the launcher of one server, as `python -m sglang_mepic.launch_server`."""
    os.setsid()
    die_with_parent()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    set_buffering(request["env"])
    sys.argv = ["sglang_mepic.launch_server", *request["argv"]]
    code = 0
    try:
        from sglang_mepic.launch.server import main

        main(request["argv"])
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkServer:
    def __init__(self, path: str, before: dict[str, str], declined: str | None = None):
        self.path, self.declined = path, declined  # declined: why every server starts cold
        self.before, self.after = before, dict(os.environ)  # the environment before and after the imports
        self.late = runtime_names()  # what the imports left to be read after them
        self.children: dict[int, tuple[int, str]] = {}  # pid → (the client's pid, where its exit status goes)

    def serve(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        staging = f"{self.path}.{os.getpid()}"
        listener.bind(staging)
        os.chmod(staging, 0o600)  # whoever can connect starts processes as this user: only this user may
        listener.listen(16)
        listener.settimeout(POLL_S)
        os.rename(staging, self.path)  # the path appears only once this process can fork a server
        try:
            while True:
                self.reap()
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                with conn:
                    reply = self.answer(conn.makefile("r").readline(), listener, conn)
                    conn.sendall((json.dumps(reply) + "\n").encode())
        finally:
            listener.close()
            if os.path.exists(self.path):
                os.unlink(self.path)

    def answer(self, line: str, listener: socket.socket, conn: socket.socket) -> dict:
        try:
            request = json.loads(line)
            keys = ("argv", "env", "log", "exit", "cwd", "client")
            argv, env, log, exit_path, cwd, client = (request[k] for k in keys)
        except (ValueError, KeyError, TypeError) as e:
            return {"error": f"bad request: {e}"}
        if self.declined:
            return {"cold": self.declined}
        if (key := env_difference(env, self.before, self.after, self.late)) is not None:
            return {"cold": f"{key} differs from the fork server's, and a module may read it at import"}
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            _run_server({"argv": argv, "env": child_env(env, self.before, self.after), "log": log, "cwd": cwd,
                         "before": self.before})
        self.children[pid] = (int(client), exit_path)
        return {"pid": pid}

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                self.children.clear()
                return
            if pid == 0:
                break
            client, exit_path = self.children.pop(pid, (0, ""))
            if exit_path:
                staging = exit_path + ".tmp"
                with open(staging, "w") as f:
                    f.write(str(os.waitstatus_to_exitcode(status)))
                os.rename(staging, exit_path)
        for pid, (client, _) in list(self.children.items()):
            if not process_exists(client):  # its client died without stopping it: as a cold server would, it dies
                try:
                    os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(f"usage: python -m sglang_mepic.launch.fork_server SOCKET (then {FORK_SERVER_ENV}=SOCKET)",
              file=sys.stderr)
        raise SystemExit(2)
    die_with_parent()
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")  # as the launcher sets it on CPU, before SGLang's imports
    before = dict(os.environ)
    start = time.monotonic()
    declined = preload()
    import torch

    if torch.cuda.is_available():
        print("fork_server: a CUDA context does not survive a fork; start servers cold on a GPU", file=sys.stderr)
        raise SystemExit(2)
    print(f"fork_server: SGLang imported in {time.monotonic() - start:.1f} s; serving on {argv[0]}",
          file=sys.stderr, flush=True)
    ForkServer(argv[0], before, declined).serve()


if __name__ == "__main__":
    main()
