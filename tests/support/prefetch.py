"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/tiers/test_prefetch.py."""

import time

import torch

from sglang_mepic.tiers.prefetch import PENDING


def same_kv(pool, a, b) -> bool:
    return all(torch.equal(k[a], k[b]) and torch.equal(v[a], v[b]) for k, v in zip(pool.k_buffer, pool.v_buffer))


def settled(tiers, key, num_slots, deadline_s=10.0):
    """Poll as the scheduler would each round until the read is no longer pending."""
    deadline = time.monotonic() + deadline_s
    while (got := tiers.poll(key, num_slots)) == PENDING and time.monotonic() < deadline:
        time.sleep(0.005)
    return got
