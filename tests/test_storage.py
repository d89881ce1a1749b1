"""Shared chunk storage (storage.py) without a server: HiCache's file backend, Mooncake Store
with a real master on loopback, and backends that are slow or fail."""

import logging
import threading
import time

import pytest
import torch

from sglang_mepic import storage
from sglang_mepic.storage import CorruptEntry, Storage, Unavailable, envelope, open_envelope

PAGE = 16


def kv(seed: int) -> torch.Tensor:
    return torch.randn(2, 2, 2 * PAGE, 2, 8, generator=torch.Generator().manual_seed(seed))


def file_storage(path, fingerprint="model-a", **kw) -> Storage:
    s = Storage("file", {"file_storage_path": str(path)}, fingerprint, **kw)
    assert s.connected()
    return s


def test_envelope_rejects():
    x = kv(0)
    data = envelope(x, "fp")
    assert torch.equal(open_envelope(data, "fp", torch.empty_like(x)), x)
    with pytest.raises(CorruptEntry, match="another model"):
        open_envelope(data, "other", torch.empty_like(x))
    with pytest.raises(CorruptEntry, match="expected"):
        open_envelope(data, "fp", torch.empty(2, 2, 4 * PAGE, 2, 8))
    bad = data.clone()
    bad[:8] = 0
    with pytest.raises(CorruptEntry, match="not a MEPIC"):
        open_envelope(bad, "fp", torch.empty_like(x))


def test_file_entries_are_shared_checked_and_removed_when_unsound(tmp_path, caplog):
    x = kv(1)
    writer = file_storage(tmp_path)
    assert writer.put("chunk", x) and writer.put("chunk", x) and writer.drain()
    assert writer.written == 1  # an entry already there is not written again
    reader = file_storage(tmp_path)  # another instance, same directory
    assert torch.equal(reader.get("chunk", torch.empty_like(x)), x)
    assert reader.get("other", torch.empty_like(x)) is None and reader.state() == "up"

    other_model = file_storage(tmp_path, "model-b")
    with caplog.at_level(logging.WARNING):
        assert other_model.get("chunk", torch.empty_like(x)) is None
    assert "another model" in caplog.text and other_model.rejected == 1
    assert other_model.drain() and reader.get("chunk", torch.empty_like(x)) is None  # a rejected entry is removed

    path = writer._io.path("chunk")
    for damage in ("flip", "truncate"):
        writer.put("chunk", x)
        writer.drain()
        data = bytearray(open(path, "rb").read())
        if damage == "flip":
            data[-5] ^= 0xFF
        open(path, "wb").write(bytes(data if damage == "flip" else data[:100]))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert reader.get("chunk", torch.empty_like(x)) is None
        assert ("checksum mismatch" if damage == "flip" else "expected") in caplog.text
        assert reader.drain()  # its removal of the rejected entry, before the next put looks for it
    assert reader.rejected == 2


class FakeIO:
    """A backend whose reads can be made slow or failing."""

    def __init__(self):
        self.entries, self.delay, self.down = {}, 0.0, False

    def _check(self):
        if self.down:
            raise Unavailable("connection refused")

    def exists(self, key):
        self._check()
        return key in self.entries

    def read(self, key, nbytes):
        time.sleep(self.delay)
        self._check()
        return self.entries.get(key)

    def write(self, key, data):
        self._check()
        self.entries[key] = data

    def remove(self, key):
        self.entries.pop(key, None)


def test_a_slow_backend_is_a_bounded_miss_and_is_used_again(monkeypatch, caplog):
    monkeypatch.setattr(storage, "RETRY_S", 0.3)
    io, x = FakeIO(), kv(2)
    s = Storage("fake", {}, "fp", timeout=0.2, io=io)
    assert s.put("chunk", x) and s.drain()
    io.delay = 1.0
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        assert s.get("chunk", torch.empty_like(x)) is None
        assert s.get("chunk", torch.empty_like(x)) is None  # left alone: no second read is started
        assert time.monotonic() - started < 0.6
    assert "unavailable: no answer within 0.2 s" in caplog.text and s.state() == "down"
    assert s.unavailable == 2 and s.outages == 1
    io.delay = 0.0
    time.sleep(1.2)  # the slow read ends and the backend is asked again
    with caplog.at_level(logging.WARNING):
        assert torch.equal(s.get("chunk", torch.empty_like(x)), x)
    assert "answers again" in caplog.text and s.state() == "up"


def test_a_backend_that_fails_is_a_miss_logged_once_and_writes_are_dropped(monkeypatch, caplog):
    monkeypatch.setattr(storage, "RETRY_S", 0.2)
    io, x = FakeIO(), kv(3)
    s = Storage("fake", {}, "fp", io=io)
    io.down = True
    with caplog.at_level(logging.WARNING):
        assert s.get("chunk", torch.empty_like(x)) is None
        assert not s.put("chunk", x)  # not queued while it is down
        time.sleep(0.3)
        assert s.get("chunk", torch.empty_like(x)) is None  # asked again, still down: no new line
    assert caplog.text.count("unavailable: connection refused") == 1
    assert s.outages == 1 and s.dropped == 1
    io.down = False
    time.sleep(0.3)
    assert s.put("chunk", x) and s.drain() and torch.equal(s.get("chunk", torch.empty_like(x)), x)


def test_a_full_write_queue_drops_writes_instead_of_growing(monkeypatch):
    monkeypatch.setattr(storage, "MAX_QUEUED", 2)
    io, gate = FakeIO(), threading.Event()
    write = io.write
    io.write = lambda key, data: (gate.wait(5), write(key, data))
    s = Storage("fake", {}, "fp", io=io)
    results = [s.put(f"k{i}", kv(i)) for i in range(4)]
    gate.set()
    assert results == [True, True, False, False] and s.dropped == 2
    assert s.drain() and sorted(io.entries) == ["k0", "k1"]


# ---- Mooncake Store: a real master on loopback --------------------------------

@pytest.fixture()
def master():
    from sglang_mepic.mooncake_master import MasterError, MooncakeMaster, check_client

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


@pytest.mark.server
def test_mooncake_entries_are_shared_between_clients_and_checked(master, caplog):
    a, b = mooncake_storage(master), mooncake_storage(master)
    x = kv(4)
    assert a.put("chunk", x) and a.drain() and a.written == 1
    assert torch.equal(b.get("chunk", torch.empty_like(x)), x)
    assert b.get("absent", torch.empty_like(x)) is None and b.state() == "up"

    a._io.write("foreign", envelope(x, "model-b"))
    bad = envelope(x, "model-a")
    bad[-3] ^= 0xFF
    a._io.write("corrupt", bad)
    a._io.write("short", envelope(x[:, :, :PAGE], "model-a"))
    with caplog.at_level(logging.WARNING):
        for key, why in (("foreign", "another model"), ("corrupt", "checksum mismatch"), ("short", "expected")):
            assert b.get(key, torch.empty_like(x)) is None
            assert why in caplog.text
    assert b.rejected == 3 and b.drain()
    assert not any(a._io.exists(k) for k in ("foreign", "corrupt", "short"))  # removed: a compile writes it again


@pytest.mark.server
def test_a_stopped_mooncake_master_is_a_logged_miss_and_is_used_again_when_back(master, monkeypatch, caplog):
    monkeypatch.setattr(storage, "RETRY_S", 0.5)
    s = mooncake_storage(master)
    x, y = kv(5), kv(6)
    assert s.put("before", x) and s.drain()
    master.stop()
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        assert s.get("before", torch.empty_like(x)) is None
        assert time.monotonic() - started < s.timeout + 0.2
        assert "MEPIC storage (mooncake) unavailable" in caplog.text and s.state() == "down"
        master.start()  # the same ports; it has forgotten every object
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(0.5)
            s.put("after", y)
            s.drain()
            got = s.get("after", torch.empty_like(y))
            if got is not None:
                break
    assert got is not None and torch.equal(got, y)
    assert "MEPIC storage (mooncake) answers again" in caplog.text and s.state() == "up"


def test_any_other_backend_goes_through_its_hicache_methods(tmp_path, caplog):
    """SGLang's `dynamic` backend naming its own HiCacheFile class: the generic path, on a real backend."""
    extra = {"backend_name": "files", "module_path": "sglang.srt.mem_cache.hicache_storage",
             "class_name": "HiCacheFile", "file_storage_path": str(tmp_path)}
    x = kv(5)
    writer, reader = (Storage("dynamic", extra, "fp") for _ in range(2))
    assert writer.connected() and reader.connected()
    assert type(writer._io) is storage.HiCacheIO
    assert writer.put("chunk", x) and writer.drain() and writer.written == 1
    assert torch.equal(reader.get("chunk", torch.empty_like(x)), x)
    assert reader.get("absent", torch.empty_like(x)) is None and reader.state() == "up"
    other_model = Storage("dynamic", extra, "other-model")
    assert other_model.connected()
    with caplog.at_level(logging.WARNING):
        assert other_model.get("chunk", torch.empty_like(x)) is None
    assert "another model" in caplog.text and other_model.rejected == 1


def test_a_backend_that_raises_is_an_outage_not_an_error(caplog):
    class Broken:
        def exists(self, key):
            raise ConnectionError("gone")

        def get(self, key, target):
            raise ConnectionError("gone")

        def set(self, key, value):
            return False

    s = Storage("broken", {}, "fp", io=storage.HiCacheIO(Broken()))
    with caplog.at_level(logging.WARNING):
        assert s.get("chunk", torch.empty_like(kv(0))) is None
    assert "unavailable: get: ConnectionError: gone" in caplog.text and s.state() == "down"


def test_settings_choose_the_backend(monkeypatch, tmp_path):
    from sglang_mepic import config

    for var in (config.STORAGE_ENV, config.STORAGE_BACKEND_ENV, config.STORAGE_CONFIG_ENV, config.STORAGE_TIMEOUT_ENV):
        monkeypatch.delenv(var, raising=False)
    assert storage.from_settings("fp") is None
    monkeypatch.setenv(config.STORAGE_ENV, str(tmp_path))
    monkeypatch.setenv(config.STORAGE_TIMEOUT_ENV, "0.25")
    s = storage.from_settings("fp")
    assert s.backend == "file" and s.timeout == 0.25 and s.connected()
    assert s.put("k", kv(7)) and s.drain() and len(list(tmp_path.glob("k*.bin"))) == 1
    monkeypatch.setenv(config.STORAGE_BACKEND_ENV, "mooncake")
    assert config.storage_backend() == "mooncake"  # (not connected here: there is no master)


@pytest.mark.server
def test_a_master_that_cannot_be_reached_at_start_is_a_logged_miss(caplog):
    from sglang_mepic.server_process import free_port

    port = free_port()
    config = {"master_server_address": f"127.0.0.1:{port}", "metadata_server": f"http://127.0.0.1:{port}/metadata",
              "protocol": "tcp", "local_hostname": "127.0.0.1", "global_segment_size": 16 << 20}
    with caplog.at_level(logging.WARNING):
        s = Storage("mooncake", config, "fp")
        assert not s.connected(timeout=120)
        assert s.get("chunk", torch.empty_like(kv(0))) is None and not s.put("chunk", kv(0))
    assert "unavailable: cannot connect" in caplog.text and s.state() == "down"
