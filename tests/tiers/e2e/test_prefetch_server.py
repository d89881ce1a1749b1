"""Storage reads in the background (prefetch.py) through the tiers' want/poll, on a real (CPU)
SGLang KV pool: nothing blocks the caller, nothing is read or hashed twice within a wait."""

from sglang_mepic.tiers.levels import Tiers
from sglang_mepic.tiers.prefetch import PENDING
from support.storage import master, mooncake_storage  # noqa: F401 (master: a fixture)
from support.tiers import PAGE, kv_pool, slots  # noqa: F401 (kv_pool: a fixture)
from support.prefetch import same_kv, settled


def test_mooncake_entries_are_read_by_concurrent_workers(kv_pool, master):
    """Mooncake reads through staging buffers it registers: each worker has its own."""
    writer, reader = (Tiers(kv_pool, PAGE, storage=mooncake_storage(master)) for _ in range(2))
    keys = [f"c{i}" for i in range(4)]
    for i, key in enumerate(keys):
        writer.persist(key, slots(1 + 2 * i, 2))
    assert writer.storage.drain()
    assert [reader.want(key, 2 * PAGE) for key in keys] == [PENDING] * 4
    assert [settled(reader, key, 2 * PAGE) for key in keys] == ["storage"] * 4
    for i, key in enumerate(keys):
        reader.place(reader.take(key, 2 * PAGE), slots(40 + 2 * i, 2), key=key)
        assert same_kv(kv_pool, slots(1 + 2 * i, 2), slots(40 + 2 * i, 2))
    assert reader.storage.rejected == 0 and reader.stats()["prefetch_reads"] == 4
