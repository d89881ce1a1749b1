"""The host and file tiers on a real (CPU) SGLang KV pool, without a server."""

import logging
import os

import pytest
import torch

from sglang_mepic.tiers import CorruptEntry, FileTier, Tiers, envelope, open_envelope

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


def load(tiers, key, device_slots):
    """Copy a chunk back into the device pool as the cache does; returns the tier it came from."""
    fetched = tiers.fetch(key, len(device_slots))
    if fetched is None:
        return None
    tiers.place(fetched, device_slots)
    return fetched[1]


def same_kv(pool, a, b) -> bool:
    return all(torch.equal(k[a], k[b]) and torch.equal(v[a], v[b]) for k, v in zip(pool.k_buffer, pool.v_buffer))


def test_host_tier_round_trip_and_lru(kv_pool):
    bytes_per_page = 2 * 3 * PAGE * 2 * 8 * 4
    tiers = Tiers(kv_pool, PAGE, "fp", host_gb=7.5 * bytes_per_page / 1e9)  # 7 pages (+1 padding page)
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


def test_file_tier_is_shared_and_checked(kv_pool, tmp_path, caplog):
    writer = Tiers(kv_pool, PAGE, "model-a", storage_dir=str(tmp_path))
    writer.persist("chunk", slots(1, 2))
    reader = Tiers(kv_pool, PAGE, "model-a", storage_dir=str(tmp_path))  # another instance, same directory
    assert "chunk" in reader.files
    assert load(reader, "chunk", slots(40, 2)) == "storage"
    assert same_kv(kv_pool, slots(1, 2), slots(40, 2))

    other_model = Tiers(kv_pool, PAGE, "model-b", storage_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING):
        assert load(other_model, "chunk", slots(50, 2)) is None
    assert "another model" in caplog.text and other_model.files.rejected == 1
    assert "chunk" not in reader.files  # a rejected entry is removed

    writer.persist("chunk", slots(1, 2))
    path = writer.files.path("chunk")
    data = bytearray(open(path, "rb").read())
    data[-5] ^= 0xFF
    open(path, "wb").write(bytes(data))
    before = kv_pool.k_buffer[0][slots(50, 2)].clone()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert load(reader, "chunk", slots(50, 2)) is None
    assert "checksum mismatch" in caplog.text
    assert torch.equal(kv_pool.k_buffer[0][slots(50, 2)], before)  # never loaded
    assert not os.path.exists(path)

    writer.persist("chunk", slots(1, 2))
    with open(path, "r+b") as f:
        f.truncate(100)
    assert load(reader, "chunk", slots(50, 2)) is None and reader.files.rejected == 2


def test_envelope_rejects():
    kv = torch.randn(2, 3, 16, 2, 8)
    data = envelope(kv, "fp")
    assert torch.equal(open_envelope(data, "fp", torch.empty_like(kv)), kv)
    with pytest.raises(CorruptEntry, match="another model"):
        open_envelope(data, "other", torch.empty_like(kv))
    with pytest.raises(CorruptEntry, match="expected"):
        open_envelope(data, "fp", torch.empty(2, 3, 32, 2, 8))
    bad = data.clone()
    bad[:8] = 0
    with pytest.raises(CorruptEntry, match="not a MEPIC"):
        open_envelope(bad, "fp", torch.empty_like(kv))


def test_file_tier_put_is_idempotent(tmp_path):
    tier = FileTier(str(tmp_path), "fp")
    kv = torch.randn(2, 1, 16, 1, 4)
    assert tier.put("k", kv) and tier.put("k", kv)
    assert torch.equal(tier.get("k", torch.empty_like(kv)), kv)
