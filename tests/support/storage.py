"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tiers/test_storage.py."""

import pytest
import torch

from sglang_mepic.tiers.storage import Storage


# ---- Mooncake Store: a real master on loopback --------------------------------

@pytest.fixture()
def master():
    from sglang_mepic.process.mooncake_master import MasterError, MooncakeMaster, check_client

    try:
        check_client()
    except MasterError as e:
        pytest.fail(str(e))  # installed by the project's set-up: missing is a defect, not a skip
    with MooncakeMaster(segment=64 << 20) as m:
        yield m


def mooncake_storage(master, fingerprint="model-a", **kw) -> Storage:
    s = Storage("mooncake", master.storage_config(), fingerprint, **kw)
    assert s.connected(), s.stats()
    return s


PAGE = 16


def kv(seed: int) -> torch.Tensor:
    return torch.randn(2, 2, 2 * PAGE, 2, 8, generator=torch.Generator().manual_seed(seed))
