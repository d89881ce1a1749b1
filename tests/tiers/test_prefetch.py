"""Storage reads in the background (prefetch.py) through the tiers' want/poll, on a real (CPU) The unit half: the whole description, and the tests on a server, are in
e2e/test_prefetch_server.py."""

import logging
import threading
import time

import torch

from sglang_mepic.tiers import storage
from sglang_mepic.tiers.levels import Tiers
from sglang_mepic.tiers.prefetch import ABSENT, PENDING, Prefetch
from sglang_mepic.tiers.backends import Unavailable
from sglang_mepic.tiers.envelope import envelope
from sglang_mepic.tiers.storage import Storage
from support.tiers import PAGE, kv_pool, slots  # noqa: F401 (kv_pool: a fixture)
from support.prefetch import same_kv, settled


def chunk_kv(pages: int) -> torch.Tensor:
    """KV of a chunk in the pool below: [2, 3 layers, tokens, 2 heads, 8 dims], float32."""
    return torch.randn(2, 3, pages * PAGE, 2, 8)


class CountingIO:
    """A backend that counts its reads and whose reads can be held or slowed."""

    def __init__(self):
        self.entries, self.reads, self.delay = {}, 0, 0.0
        self.gate = threading.Event()
        self.gate.set()
        self.threads: set[str] = set()

    def exists(self, key):
        return key in self.entries

    def read(self, key, nbytes):
        self.threads.add(threading.current_thread().name)
        self.reads += 1
        self.gate.wait(10)
        time.sleep(self.delay)
        return self.entries.get(key)

    def write(self, key, data):
        self.entries[key] = data

    def remove(self, key):
        self.entries.pop(key, None)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def tiers_on(kv_pool, io, timeout=10.0, **prefetch) -> Tiers:
    tiers = Tiers(kv_pool, PAGE, storage=Storage("fake", {}, "model-a", timeout=timeout, io=io))
    if prefetch:
        tiers.prefetch = Prefetch(tiers.storage, **prefetch)
    return tiers


def test_a_stored_chunk_is_read_in_the_background_and_placed_once(kv_pool, tmp_path):
    shared = Storage("file", {"file_storage_path": str(tmp_path)}, "model-a", timeout=10)
    assert shared.connected()
    writer = Tiers(kv_pool, PAGE, storage=shared)
    writer.persist("chunk", slots(1, 2))
    assert writer.storage.drain()
    reader_storage = Storage("file", {"file_storage_path": str(tmp_path)}, "model-a", timeout=10)
    assert reader_storage.connected()
    reader = Tiers(kv_pool, PAGE, storage=reader_storage)

    assert reader.want("chunk", 2 * PAGE) == PENDING
    assert reader.take("chunk", 2 * PAGE) is None  # nothing to place yet
    assert settled(reader, "chunk", 2 * PAGE) == "storage"
    fetched = reader.take("chunk", 2 * PAGE)
    assert fetched[1] == "storage" and reader.take("chunk", PAGE) is None  # (not this chunk's size)
    reader.place(fetched, slots(40, 2), key="chunk")
    assert same_kv(kv_pool, slots(1, 2), slots(40, 2))
    stats = reader.stats()
    assert stats["tier_loads_storage"] == 1 and stats["prefetch_reads"] == 1
    assert stats["prefetch_kept_chunks"] == 0 and stats["prefetch_kept_bytes"] == 0  # let go once placed
    assert stats["storage_state"] == "up" and stats["storage_unavailable_misses"] == 0


def test_a_request_waiting_for_room_never_reads_or_hashes_its_entry_again(kv_pool, monkeypatch):
    io = CountingIO()
    tiers = tiers_on(kv_pool, io)
    tiers.persist("chunk", slots(1, 2))
    assert tiers.storage.drain()
    opened = []
    real_open = storage.open_envelope
    monkeypatch.setattr(storage, "open_envelope", lambda *a, **k: opened.append(1) or real_open(*a, **k))
    assert tiers.want("chunk", 2 * PAGE) == PENDING
    assert settled(tiers, "chunk", 2 * PAGE) == "storage"
    first = tiers.take("chunk", 2 * PAGE)
    for _ in range(20):  # planned every round while the pool has no room: answered from memory
        assert tiers.want("chunk", 2 * PAGE) == "storage"
        again = tiers.take("chunk", 2 * PAGE)
        assert again[1] == "storage" and again[0] is first[0]
    assert io.reads == 1 and len(opened) == 1
    assert tiers.stats()["prefetch_remembered"] == 20
    tiers.place(again, slots(30, 2), key="chunk")
    assert same_kv(kv_pool, slots(1, 2), slots(30, 2))


def test_an_absent_or_rejected_entry_is_remembered_for_a_bounded_time(kv_pool, caplog):
    io, clock = CountingIO(), Clock()
    tiers = tiers_on(kv_pool, io, absent_s=5.0, clock=clock)
    io.entries[tiers.storage.storage_key("corrupt")] = envelope(chunk_kv(2), "other-settings")
    with caplog.at_level(logging.WARNING):
        for key in ("missing", "corrupt"):
            assert tiers.want(key, 2 * PAGE) == PENDING
            assert settled(tiers, key, 2 * PAGE) == ABSENT
            for _ in range(10):
                assert tiers.want(key, 2 * PAGE) == ABSENT
    assert io.reads == 2 and tiers.storage.rejected == 1 and caplog.text.count("rejected") == 1
    clock.now += 5.1  # the bound is over: asked again
    assert tiers.want("missing", 2 * PAGE) == PENDING and settled(tiers, "missing", 2 * PAGE) == ABSENT
    assert io.reads == 3
    tiers.persist("missing", slots(1, 2))  # our own compile wrote it: its absence is forgotten
    assert tiers.storage.drain()
    assert tiers.want("missing", 2 * PAGE) == PENDING and settled(tiers, "missing", 2 * PAGE) == "storage"
    assert tiers.storage.state() == "up" and tiers.storage.unavailable == 0


def test_a_slow_read_never_blocks_the_caller_and_times_out_as_a_miss(kv_pool, monkeypatch, caplog):
    monkeypatch.setattr(storage, "RETRY_S", 0.5)
    io = CountingIO()
    tiers = tiers_on(kv_pool, io, timeout=0.2)
    tiers.persist("chunk", slots(1, 2))
    assert tiers.storage.drain()
    io.delay = 1.0
    started = time.monotonic()
    assert tiers.want("chunk", 2 * PAGE) == PENDING and tiers.poll("chunk", 2 * PAGE) == PENDING
    assert time.monotonic() - started < 0.1  # the storage timeout is 0.2 s and the read takes 1 s
    with caplog.at_level(logging.WARNING):
        assert settled(tiers, "chunk", 2 * PAGE) == ABSENT
        assert time.monotonic() - started < 0.6
        assert tiers.want("chunk", 2 * PAGE) == ABSENT  # remembered: no second read
        assert tiers.want("other", 2 * PAGE) == ABSENT  # the backend is left alone: no read either
    assert "unavailable: no answer within 0.2 s" in caplog.text and tiers.storage.state() == "down"
    assert io.reads == 1 and tiers.storage.unavailable == 2 and tiers.storage.outages == 1
    io.delay = 0.0
    time.sleep(1.2)  # the slow read ends, its late answer is dropped; the backend is asked again
    tiers.clear_host()  # (a flush forgets remembered absences too)
    assert tiers.want("chunk", 2 * PAGE) == PENDING and settled(tiers, "chunk", 2 * PAGE) == "storage"
    assert tiers.storage.state() == "up"


def test_reads_in_flight_are_bounded(kv_pool):
    io = CountingIO()
    tiers = tiers_on(kv_pool, io, max_in_flight=2)
    for i in range(3):
        tiers.persist(f"c{i}", slots(1 + 2 * i, 2))
    assert tiers.storage.drain()
    io.gate.clear()
    assert [tiers.want(f"c{i}", 2 * PAGE) for i in range(3)] == [PENDING] * 3
    assert tiers.stats()["prefetch_in_flight"] == 2 and tiers.stats()["prefetch_deferred"] == 1
    io.gate.set()
    assert settled(tiers, "c0", 2 * PAGE) == "storage" and settled(tiers, "c1", 2 * PAGE) == "storage"
    assert tiers.poll("c2", 2 * PAGE) == ABSENT  # never started: nothing known of it
    assert tiers.want("c2", 2 * PAGE) == PENDING and settled(tiers, "c2", 2 * PAGE) == "storage"
    assert io.reads == 3


def test_fetched_entries_are_bounded_least_recently_used_first(kv_pool):
    io = CountingIO()
    chunk_bytes = chunk_kv(2).numel() * 4
    tiers = tiers_on(kv_pool, io, keep_bytes=2 * chunk_bytes)
    for i in range(3):
        tiers.persist(f"c{i}", slots(1 + 2 * i, 2))
    assert tiers.storage.drain()
    for key in ("c0", "c1"):
        tiers.want(key, 2 * PAGE)
        settled(tiers, key, 2 * PAGE)
    tiers.want("c0", 2 * PAGE)  # c0 used again: c1 is now the oldest
    tiers.want("c2", 2 * PAGE)
    assert settled(tiers, "c2", 2 * PAGE) == "storage"
    stats = tiers.stats()
    assert stats["prefetch_kept_chunks"] == 2 and stats["prefetch_kept_bytes"] == 2 * chunk_bytes
    assert stats["prefetch_dropped"] == 1 and io.reads == 3
    assert tiers.want("c0", 2 * PAGE) == "storage" and io.reads == 3
    assert tiers.want("c1", 2 * PAGE) == PENDING  # dropped: read again

    small = tiers_on(kv_pool, io, keep_bytes=chunk_bytes - 1)  # a chunk it could not hold until placed
    assert small.want("c0", 2 * PAGE) == PENDING and settled(small, "c0", 2 * PAGE) == ABSENT
    assert small.take("c0", 2 * PAGE) is None and small.stats()["prefetch_dropped"] == 1


def test_the_worker_only_reads_and_the_caller_owns_the_counters(kv_pool, monkeypatch):
    io = CountingIO()
    tiers = tiers_on(kv_pool, io)
    settled_on = []
    real_settle = tiers.storage.settle
    monkeypatch.setattr(tiers.storage, "settle",
                        lambda *a: settled_on.append(threading.current_thread().name) or real_settle(*a))
    io.entries[tiers.storage.storage_key("bad")] = envelope(chunk_kv(2), "model-a")[:-4]
    assert tiers.want("bad", 2 * PAGE) == PENDING
    deadline = time.monotonic() + 10
    while tiers.prefetch._reads["bad"].future.done() is False and time.monotonic() < deadline:
        time.sleep(0.005)
    assert tiers.storage.rejected == 0  # read and checked, not yet accounted for
    assert settled(tiers, "bad", 2 * PAGE) == ABSENT and tiers.storage.rejected == 1
    assert settled_on == [threading.current_thread().name]
    assert io.threads and all(name.startswith("mepic-prefetch") for name in io.threads)


def test_a_backend_that_raises_in_the_background_is_an_outage(kv_pool, caplog):
    class Broken(CountingIO):
        def read(self, key, nbytes):
            raise ConnectionError("gone")

    tiers = tiers_on(kv_pool, Broken())
    with caplog.at_level(logging.WARNING):
        assert tiers.want("chunk", 2 * PAGE) == PENDING and settled(tiers, "chunk", 2 * PAGE) == ABSENT
    assert "unavailable: read: ConnectionError: gone" in caplog.text and tiers.storage.state() == "down"


def test_a_host_tier_hit_is_answered_at_once(kv_pool):
    bytes_per_page = 2 * 3 * PAGE * 2 * 8 * 4
    io = CountingIO()
    tiers = Tiers(kv_pool, PAGE, host_gb=7.5 * bytes_per_page / 1e9,
                  storage=Storage("fake", {}, "model-a", timeout=10, io=io))
    tiers.demote("a", slots(1, 3))
    assert tiers.want("a", 3 * PAGE) == "host" and io.reads == 0
    fetched = tiers.take("a", 3 * PAGE)
    assert fetched[1] == "host"
    expected = tiers.device.gather(slots(1, 3))
    kv_pool.k_buffer[0][slots(1, 3)] = 0  # the taken copy is its own
    tiers.demote("b", slots(4, 3))
    tiers.demote("c", slots(7, 3))  # making room evicts a from the host tier: the taken copy stands
    assert "a" not in tiers.host
    tiers.place(fetched, slots(20, 3), key="a")
    assert torch.equal(tiers.device.gather(slots(20, 3)), expected) and tiers.stats()["tier_loads_host"] == 1
    assert tiers.want("b", 2 * PAGE) == ABSENT  # another size: not this chunk's KV


def test_without_storage_a_miss_is_absent_at_once(kv_pool):
    tiers = Tiers(kv_pool, PAGE)
    assert tiers.want("chunk", 2 * PAGE) == ABSENT and tiers.poll("chunk", 2 * PAGE) == ABSENT
    assert "prefetch_reads" not in tiers.stats()


def test_unavailable_reads_are_outages_in_the_synchronous_path_too():
    class Down(CountingIO):
        def read(self, key, nbytes):
            raise Unavailable("connection refused")

    s = Storage("fake", {}, "fp", io=Down())
    assert s.get("chunk", torch.empty(2, 2, PAGE, 2, 8)) is None
    assert s.state() == "down" and s.unavailable == 1 and s.outages == 1


def test_the_prefetch_bench_runs_and_checks_itself(tiny_model):
    # It asserts the loaded KV equals the stored chunks' and that no read missed before it returns.
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "eval" / "bench" / "prefetch.py"
    spec = importlib.util.spec_from_file_location("bench_prefetch", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    config = json.loads((Path(tiny_model) / "config.json").read_text())
    figures = bench.measure(config, chunks=2, chunk_pages=1, reps=2)
    assert len(figures) == 6 and all(ms > 0 for ms in figures.values()), figures
