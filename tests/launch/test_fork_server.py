"""The fork server's rules for a server's environment (sglang_mepic/launch/fork_server.py): which
differences still allow a fork, and what the forked launcher's environment becomes."""

import os
import sys

from sglang_mepic.launch.fork_server import child_env, env_difference, set_buffering

BEFORE = {"PATH": "/bin", "HOME": "/root"}
AFTER = {**BEFORE, "TRITON_CACHE_DIR": "/root/.cache/sglang/triton", "SGL_X": "1", "SGLANG_X": "1"}


def test_the_same_environment_forks():
    assert env_difference(dict(BEFORE), BEFORE, AFTER) is None
    assert env_difference(dict(AFTER), BEFORE, AFTER) is None  # a client that imported SGLang itself


def test_a_variable_a_module_may_read_at_import_starts_cold():
    assert env_difference({**BEFORE, "OMP_NUM_THREADS": "2,1"}, BEFORE, AFTER) == "OMP_NUM_THREADS"  # per level
    assert env_difference({**BEFORE, "OMP_NUM_THREADS": "0"}, BEFORE, AFTER) == "OMP_NUM_THREADS"
    # A count too: set in the child, it is no cold start (fork_server.py, RUNTIME_NAMES' note).
    assert env_difference({**BEFORE, "OMP_NUM_THREADS": "1"}, BEFORE, AFTER) == "OMP_NUM_THREADS"
    assert env_difference({**BEFORE, "PATH": "/usr/bin"}, BEFORE, AFTER) == "PATH"
    assert env_difference({"PATH": "/bin"}, BEFORE, AFTER) == "HOME"  # one removed counts too
    assert env_difference({**BEFORE, "SGLANG_X": "2"}, BEFORE, AFTER) == "SGLANG_X"


def test_settings_read_at_run_time_may_differ():
    client = {**BEFORE, "SGLANG_MEPIC_MODE": "full", "PYTEST_CURRENT_TEST": "t", "TORCHINDUCTOR_CACHE_DIR": "/tmp/i",
              "TRITON_CACHE_DIR": "/tmp/t", "COLUMNS": "80", "LINES": "24",
              "PYTHONUNBUFFERED": "1"}
    assert env_difference(client, BEFORE, AFTER) is None
    gpu_run = {**BEFORE, "SGLANG_FORCE_FUSED_OP_BACKEND": "torch", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK": "1",
               "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1", "MEPIC_PREFILL_GRAPHS_OFF_FILE": "/tmp/x",
               "SHLVL": "3", "_": "/usr/bin/python"}  # eval/gpu/e2e's servers (started by run.sh), dry on CPU
    assert env_difference(gpu_run, BEFORE, AFTER) is None


def test_a_fused_op_backend_resolved_at_import_is_no_longer_a_run_time_name(monkeypatch):
    """SGLANG_FORCE_FUSED_OP_BACKEND may differ from the fork server's only while SGLang has not resolved it:
    it does so on the first fused op, in the child; had an import resolved it, every child would keep the
    parent's, so such a server starts cold."""
    import types

    from sglang_mepic.launch import fork_server

    unresolved = object()
    fused_op = types.SimpleNamespace(_UNRESOLVED=unresolved, _forced_backend=unresolved)
    monkeypatch.setitem(sys.modules, "sglang.kernels.fused_op", fused_op)
    assert fork_server.runtime_names() == fork_server.RUNTIME_NAMES
    client = {**BEFORE, fork_server.FUSED_OP_BACKEND: "torch"}
    assert env_difference(client, BEFORE, AFTER, fork_server.runtime_names()) is None
    fused_op._forced_backend = None  # resolved: no backend forced
    assert env_difference(client, BEFORE, AFTER, fork_server.runtime_names()) == fork_server.FUSED_OP_BACKEND


def test_the_child_gets_what_the_imports_set_unless_the_client_set_it_itself():
    assert child_env(dict(BEFORE), BEFORE, AFTER) == AFTER
    own = child_env({**BEFORE, "TRITON_CACHE_DIR": "/tmp/t", "SGLANG_MEPIC_MODE": "full"}, BEFORE, AFTER)
    assert own["TRITON_CACHE_DIR"] == "/tmp/t" and own["SGLANG_MEPIC_MODE"] == "full" and own["SGL_X"] == "1"
    removed = child_env({"PATH": "/bin", "HOME": "/root", "GONE": "1"}, {**BEFORE, "GONE": "1"}, BEFORE)
    assert "GONE" not in removed  # an import that unset a variable unsets it in the child too


def test_without_its_socket_it_prints_its_usage_and_exits_2():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "sglang_mepic.launch.fork_server"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "usage: python -m sglang_mepic.launch.fork_server SOCKET" in done.stderr


def test_a_malformed_request_is_refused_and_nothing_is_forked():
    from sglang_mepic.launch.fork_server import ForkServer

    server = ForkServer("/nonexistent", dict(BEFORE))
    for line in ("not json\n", "{}\n", '{"argv": []}\n', "[1, 2]\n", ""):
        reply = server.answer(line, listener=None, conn=None)
        assert reply.keys() == {"error"} and reply["error"].startswith("bad request"), (line, reply)
    assert server.children == {}


def test_a_forked_child_asked_for_unbuffered_output_writes_at_once(tmp_path):
    """PYTHONUNBUFFERED is read when Python starts: a child asked for it writes each line as it is printed."""
    log = tmp_path / "log"
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT)
        os.dup2(fd, 1)
        set_buffering({**BEFORE, "PYTHONUNBUFFERED": "1"})
        print("written", end="")  # no newline, no flush
        os._exit(0)  # exits without flushing anything
    os.waitpid(pid, 0)
    assert log.read_text() == "written"
