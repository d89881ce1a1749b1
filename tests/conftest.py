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
    """eval/ is not installed and the repository root stays off sys.path (its kernels/ would shadow
    the PyPI package), so the package is registered from its folder once, for every test module;
    its own imports then resolve (`from eval import run`)."""
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


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The random-weight test Llama, built on first use (about 5 s)."""
    return str(models.build(models.TEST_MODEL))


@pytest.fixture(scope="session")
def tiny_server(tiny_model):
    """One real SGLang server on the tiny model at float32, shared by the e2e tests."""
    with ServerProcess(tiny_model, "--dtype", "float32") as server:
        yield server


@pytest.fixture(scope="session")
def smollm2_server():
    """One real server on the default model (SmolLM2-135M, float32): its tokenizer adds no BOS,
    so an empty text is a prompt of no tokens, which the tiny model's tokenizer never sends."""
    with ServerProcess(models.build("smollm2-135m"), "--dtype", "float32") as server:
        yield server


@pytest.fixture(scope="session")
def exact_server(tiny_model):
    """The mepic cache with every chunk block recomputed: chunked requests take the whole
    reuse path (layout, pads, planning) but share nothing, so outputs equal the plain prompt's."""
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-recompute-blocks", "all") as server:
        yield server


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


@pytest.fixture
def env(monkeypatch):
    """Markup settings cleared for the test; `env(separator=..., auto_chunk=...)` sets them
    (`config.<NAME>_ENV`), and they are restored after it."""
    from sglang_mepic import config

    for var in (config.SEPARATOR_ENV, config.AUTO_CHUNK_ENV, config.TEXT_MARKUP_ENV, config.MAX_CHUNKS_ENV):
        monkeypatch.delenv(var, raising=False)

    def set_(**values):
        for name, value in values.items():
            monkeypatch.setenv(getattr(config, name.upper() + "_ENV"), value)
    return set_
