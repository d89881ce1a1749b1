import os

# Must precede any import of the Triton kernels: @triton.jit reads it at decoration
# time. Servers started by the tests do not inherit it (see ServerProcess).
os.environ.setdefault("TRITON_INTERPRET", "1")

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402
import requests  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# SGLang modules imported by unit tests pick their CPU code paths at import time.
os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from sglang_mepic.launch import models
from sglang_mepic.process.server_process import ServerProcess  # noqa: E402


def _register_eval() -> None:
    """eval/ is not installed and the repository root stays off sys.path (its folders would shadow
    the PyPI package), so the package is registered from its folder once, for every test module;
    its own imports then resolve (`from eval.experiments import run`)."""
    import importlib.util
    import sys
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "eval"
    if "eval" not in sys.modules:
        spec = importlib.util.spec_from_file_location("eval", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        sys.modules["eval"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["eval"])


_register_eval()


@pytest.fixture(scope="session", autouse=True)
def fork_server(request, tmp_path_factory):
    """Where the session runs tests that start servers (marked `server`), a fork server (sglang_mepic/launch/fork_server.py)
    that every ServerProcess of the session, and of the commands it runs, starts its servers from: SGLang
    is imported once, not once per server (about 18 s of each start on 2 cores). `SGLANG_MEPIC_TEST_COLD=1`
    starts every server cold, as before."""
    import subprocess
    import sys
    import tempfile

    from sglang_mepic.process.server_process import FORK_SERVER_ENV, die_with_parent

    wanted = any(item.get_closest_marker("server") for item in request.session.items)
    if not wanted or os.environ.get("SGLANG_MEPIC_TEST_COLD") or os.environ.get(FORK_SERVER_ENV):
        yield None
        return
    folder = tmp_path_factory.mktemp("fork-server")
    path = str(folder / "socket")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # as ServerProcess passes it on
    with open(folder / "log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sglang_mepic.launch.fork_server", path], env=env,
                                stdout=log, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
                                preexec_fn=die_with_parent)
    os.environ[FORK_SERVER_ENV] = path
    try:
        yield path
    finally:
        os.environ.pop(FORK_SERVER_ENV, None)
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The random-weight test Llama, built on first use (about 5 s)."""
    return str(models.build(models.TEST_MODEL))


class SharedServers:
    """Real servers on the tiny model at float32, one per set of flags, shared by every test that asks
    for the same flags (most of make test's time was servers starting, several with the same flags).

    At most `keep` run at once (about 1.5 GB each); the least recently used stops first. Each `get`
    flushes the cache and asserts that no page is held: a test starts from an empty cache, whatever
    ran on the server before it.
    """

    def __init__(self, model: str, keep: int = 3):
        self.model, self.keep = model, keep  # `stop_all()` before a test that needs free RAM (host tiers)
        self.live: dict[tuple, ServerProcess] = {}

    def get(self, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
        key = (flags, tuple(sorted((env or {}).items())))
        server = self.live.pop(key, None)
        if server is None or server.proc.poll() is not None:
            while len(self.live) >= self.keep:
                self.live.pop(next(iter(self.live))).stop()
            server = ServerProcess(self.model, "--dtype", "float32", *flags, env=env).start()
        self.live[key] = server  # most recently used last
        assert_clean(server)
        return server

    def stop_all(self) -> None:
        for server in self.live.values():
            server.stop()
        self.live.clear()


def assert_clean(server: ServerProcess, idle_within: float = 30.0) -> None:
    """Flush the cache; a mepic server must then hold no page. SGLang refuses a flush while requests run:
    a request the last test left finishing (an abort, a refused batch's other items) gets `idle_within`."""
    import time

    deadline = time.monotonic() + idle_within
    while (r := requests.post(server.url + "/flush_cache", timeout=60)).status_code != 200:
        assert time.monotonic() < deadline, f"the server did not go idle for a flush: {r.status_code} {r.text}"
        time.sleep(0.5)
    state = requests.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]
    if "mepic" in state:
        assert state["mepic"]["kv_pages_in_use"] == 0, state["mepic"]
        assert state["mepic"]["kv_pages_free"] == state["mepic"]["kv_pages_total"], state["mepic"]


@pytest.fixture(scope="session")
def servers(tiny_model):
    """`servers.get(*flags)`: a shared tiny-model server with those flags, flushed and clean."""
    shared = SharedServers(tiny_model)
    yield shared
    shared.stop_all()


@pytest.fixture
def tiny_server(servers):
    """The default server (tiny model, float32), flushed and clean."""
    return servers.get()


@pytest.fixture(scope="module")  # one module uses it: its ~2 GB go when the module ends
def smollm2_server():
    """One real server on the default model (SmolLM2-135M, float32): its tokenizer adds no BOS,
    so an empty text is a prompt of no tokens, which the tiny model's tokenizer never sends."""
    with ServerProcess(models.build("smollm2-135m"), "--dtype", "float32") as server:
        yield server


@pytest.fixture
def exact_server(servers):
    """The mepic cache with every chunk block recomputed: chunked requests take the whole
    reuse path (layout, pads, planning) but share nothing, so outputs equal the plain prompt's."""
    return servers.get("--mepic-recompute-blocks", "all")


def _generate(server, text, max_new_tokens):
    r = requests.post(server.url + "/generate", timeout=120, json={
        "text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="session")
def run_prompt_set():
    """The foundation prompt set, for comparing two servers.

    Sequential requests (short, long, repeated and extended prompts, so prefix-cache
    hits happen) give (output ids, cached tokens); then 8 concurrent requests give
    output ids.
    """
    words = open(os.__file__).read().split()
    long = " ".join(words[:400])
    sequential = ["def hello(x):", " ".join(words[:120]), long, long, long + " tail", " ".join(words[:120])]
    concurrent = [" ".join(words[i * 30:i * 30 + 150]) for i in range(8)]

    def run(server):
        # Shared servers have served other tests: start both sides from an empty cache.
        assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
        seq = [_generate(server, p, 16) for p in sequential]
        with ThreadPoolExecutor(8) as pool:
            conc = list(pool.map(lambda p: _generate(server, p, 8), concurrent))
        return ([(r["output_ids"], r["meta_info"]["cached_tokens"]) for r in seq],
                [r["output_ids"] for r in conc])

    return run


@pytest.fixture(scope="session")
def tok(tiny_model):
    """The tiny model's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(autouse=True)
def settings_read_per_test():
    """Each test's process settings are read from its own environment, at its first read (as a server process
    reads them at its start); a test that sets a variable after that reads them again (`env.reload()`)."""
    from sglang_mepic import env as process_env

    process_env._current = None
    yield
    process_env._current = None


@pytest.fixture
def env(monkeypatch):
    """Markup settings cleared for the test; `env(separator=..., auto_chunk=...)` sets them (the rows
    `config.<NAME>`) and reads the settings again; they are restored after it."""
    from sglang_mepic import config
    from sglang_mepic import env as process_env

    for var in (config.SEPARATOR.env, config.AUTO_CHUNK.env, config.TEXT_MARKUP.env, config.MAX_CHUNKS.env):
        monkeypatch.delenv(var, raising=False)

    def set_(**values):
        for name, value in values.items():
            monkeypatch.setenv(getattr(config, name.upper()).env, value)
        process_env.reload()
    return set_


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Tests under an `e2e` folder start a real server: they are marked `server` here, not one by one."""
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    for item in items:
        path = Path(str(item.path)).resolve()
        if path.is_relative_to(tests) and "e2e" in path.relative_to(tests).parts[:-1]:
            item.add_marker(pytest.mark.server)
