"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tiers/test_tiers.py."""

import pytest
import torch


PAGE = 16


@pytest.fixture()
def kv_pool():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(64 * PAGE, PAGE, torch.float32, 2, 8, 3, "cpu", False, start_layer=0, end_layer=2)
    torch.manual_seed(0)
    for k, v in zip(pool.k_buffer, pool.v_buffer):
        k.normal_()
        v.normal_()
    return pool


def slots(first_page: int, pages: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + pages) * PAGE)
