"""The host tier and shared storage on a real (CPU) SGLang KV pool, without a server."""

import logging
import os
import time

import torch

from sglang_mepic.tiers.levels import PENDING, Tiers
from sglang_mepic.tiers.storage import Storage
from support.tiers import PAGE, kv_pool, slots  # noqa: F401 (kv_pool: fixtures)


def load(tiers, key, device_slots):
    """Copy a chunk back into the device pool as the cache does (a storage entry is read in the
    background while the request waits); returns the tier it came from."""
    n, waited = len(device_slots), time.monotonic()
    while tiers.want(key, n) == PENDING:
        assert time.monotonic() - waited < 60, "a storage read pending for a minute"
        time.sleep(0.001)
    fetched = tiers.take(key, n)
    if fetched is None:
        return None
    tiers.place(fetched, device_slots, key)
    return fetched[1]


def same_kv(pool, a, b) -> bool:
    return all(torch.equal(k[a], k[b]) and torch.equal(v[a], v[b]) for k, v in zip(pool.k_buffer, pool.v_buffer))


def test_host_tier_round_trip_and_lru(kv_pool):
    bytes_per_page = 2 * 3 * PAGE * 2 * 8 * 4
    tiers = Tiers(kv_pool, PAGE, host_gb=7.5 * bytes_per_page / 1e9)  # 7 pages (+1 padding page)
    assert tiers.host.pages_total() == 7
    tiers.demote("a", slots(1, 3))
    tiers.demote("b", slots(4, 3))
    assert "a" in tiers.host and "b" in tiers.host and "c" not in tiers.host
    assert load(tiers, "a", slots(20, 3)) == "host"  # a is now the most recently used
    assert same_kv(kv_pool, slots(1, 3), slots(20, 3))
    tiers.demote("c", slots(7, 3))  # 9 pages > 7: the least recently used (b) goes
    assert "b" not in tiers.host and "a" in tiers.host and "c" in tiers.host
    assert tiers.host.evictions == 1 and tiers.host.pages_used() == 6
    assert load(tiers, "b", slots(30, 3)) is None
    tiers.demote("huge", slots(10, 8))  # bigger than the whole tier: not kept, nothing evicted
    assert "huge" not in tiers.host and len(tiers.host) == 2


def test_a_chunk_persisted_by_one_instance_is_loaded_by_another(kv_pool, tmp_path):
    def tiers():
        shared = Storage("file", {"file_storage_path": str(tmp_path)}, "model-a", timeout=10)  # a load's slow read is not a miss here
        assert shared.connected()
        return Tiers(kv_pool, PAGE, host_gb=0.01, storage=shared)

    writer, reader = tiers(), tiers()
    writer.persist("chunk", slots(1, 2))
    assert writer.storage.drain()
    assert load(reader, "chunk", slots(40, 2)) == "storage"
    assert same_kv(kv_pool, slots(1, 2), slots(40, 2))
    assert "chunk" in reader.host  # kept on the host for the next time
    assert load(reader, "chunk", slots(50, 2)) == "host"
    assert reader.stats()["tier_loads_storage"] == 1 and reader.stats()["storage_state"] == "up"
