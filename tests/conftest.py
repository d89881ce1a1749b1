import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from sglang_mepic import models  # noqa: E402
from sglang_mepic.server_process import ServerProcess  # noqa: E402


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
def mepic_server(tiny_model):
    """The tiny model behind `--radix-cache-backend mepic` (page size 16 by default)."""
    with ServerProcess(tiny_model, "--dtype", "float32", "--radix-cache-backend", "mepic") as server:
        yield server
