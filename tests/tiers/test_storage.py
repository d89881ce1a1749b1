"""Shared chunk storage (storage.py) without a server: HiCache's file backend, Mooncake Store The unit half: the whole description, and the tests on a server, are in
e2e/test_storage_server.py."""

import logging
import os
import threading
import time

import pytest
import torch

from sglang_mepic.tiers import storage
from sglang_mepic.tiers import backends
from sglang_mepic.tiers import envelope as entries
from sglang_mepic.tiers.backends import Unavailable
from sglang_mepic.tiers.envelope import CorruptEntry, ForeignEntry, envelope, open_envelope
from sglang_mepic.tiers.storage import Storage
from support.storage import PAGE, kv


# Reads of a local backend are bounded generously here: under CI's load a read can take longer than the
# server's 0.5 s default, and a read that times out is a miss, not what these tests check.
READ_S = 10


def file_storage(path, fingerprint="model-a", **kw) -> Storage:
    kw.setdefault("timeout", READ_S)
    s = Storage("file", {"file_storage_path": str(path)}, fingerprint, **kw)
    assert s.connected()
    return s


def test_envelope_rejects():
    x = kv(0)
    data = envelope(x, "fp")
    assert torch.equal(open_envelope(data, "fp", torch.empty_like(x)), x)
    with pytest.raises(ForeignEntry, match="another model"):
        open_envelope(data, "other", torch.empty_like(x))
    with pytest.raises(CorruptEntry, match="expected"):
        open_envelope(data, "fp", torch.empty(2, 2, 4 * PAGE, 2, 8))
    bad = data.clone()
    bad[:8] = 0
    with pytest.raises(ForeignEntry, match="not a MEPIC"):
        open_envelope(bad, "fp", torch.empty_like(x))


def test_an_entry_is_authenticated_with_the_secret():
    x = kv(0)
    signed = envelope(x, "fp", b"s3cret")
    assert torch.equal(open_envelope(signed, "fp", torch.empty_like(x), b"s3cret"), x)
    for data, secret in ((signed, b"other"), (envelope(x, "fp"), b"s3cret")):  # wrong key; unsigned
        with pytest.raises(CorruptEntry, match="authentication failed"):
            open_envelope(data, "fp", torch.empty_like(x), secret)
    forged = signed.clone()  # payload changed and its checksum recomputed: only the HMAC can tell
    forged[-1] ^= 0xFF
    import hashlib
    forged[40:72] = torch.frombuffer(bytearray(hashlib.sha256(forged[entries._HEADER.size:].numpy().tobytes())
                                               .digest()), dtype=torch.uint8)
    with pytest.raises(CorruptEntry, match="authentication failed"):
        open_envelope(forged, "fp", torch.empty_like(x), b"s3cret")


SETTINGS = dict(model="m", mode="mepic", canonical_from=1, compile_sink="none", placement="trailing",
                page_size=16, kv_dtype="torch.float8_e4m3fn/torch.uint8", tp_rank=0, tp_size=1)
OTHER = dict(model="m2", mode="naive", canonical_from=2, compile_sink="bos", placement="leading",
             page_size=32, kv_dtype="torch.float8_e5m2/torch.uint8", tp_rank=1, tp_size=2)


def test_the_settings_fingerprint_covers_every_setting_that_shapes_the_bytes():
    assert set(SETTINGS) == set(entries.SETTINGS) == set(OTHER)
    base = storage.settings_fingerprint(**SETTINGS)
    assert base == storage.settings_fingerprint(**SETTINGS) and len(base) == 32
    prints = {name: storage.settings_fingerprint(**{**SETTINGS, name: OTHER[name]}) for name in SETTINGS}
    assert len({base, *prints.values()}) == len(SETTINGS) + 1, prints
    assert storage.settings_fingerprint(**{**SETTINGS, "canonical_from": None}) != base  # 'all' vs 1
    with pytest.raises(TypeError, match="missing"):
        storage.settings_fingerprint(model="m")


def test_storage_keys_follow_the_settings_and_the_secret(tmp_path):
    def store(secret=None, **changed):
        s = Storage("fake", {}, "", io=FakeIO(), secret=secret, settings={**SETTINGS, **changed})
        s.bind(page_size=SETTINGS["page_size"], kv_dtype=SETTINGS["kv_dtype"])
        return s
    keys = {store().storage_key("chunk"), store(secret=b"a").storage_key("chunk"),
            store(secret=b"b").storage_key("chunk"), *(store(**{k: OTHER[k]}).storage_key("chunk")
                                                      for k in SETTINGS if k not in ("page_size", "kv_dtype"))}
    assert len(keys) == 3 + len(SETTINGS) - 2
    s = store()
    assert s.fingerprint == storage.settings_fingerprint(**SETTINGS)
    s.bind(page_size=32, kv_dtype=SETTINGS["kv_dtype"])
    assert s.fingerprint == storage.settings_fingerprint(**{**SETTINGS, "page_size": 32})
    assert s.storage_key("chunk") not in keys


def test_entries_of_different_settings_coexist_in_one_directory(tmp_path, caplog):
    a, b = kv(1), kv(11)[:, :, :PAGE]  # other settings, other sizes (say, recompute blocks 1 and 2)
    one, two = file_storage(tmp_path, "settings-1"), file_storage(tmp_path, "settings-2")
    assert one.put("chunk", a) and two.put("chunk", b) and one.drain() and two.drain()
    assert len(list(tmp_path.glob("*.bin"))) == 2
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            assert torch.equal(one.get("chunk", torch.empty_like(a)), a)
            assert torch.equal(two.get("chunk", torch.empty_like(b)), b)
    assert one.rejected == two.rejected == 0 and "rejected" not in caplog.text


def test_a_mismatched_entry_is_a_miss_logged_once_and_kept(tmp_path, caplog):
    x = kv(1)
    writer = file_storage(tmp_path)
    assert writer.put("chunk", x) and writer.put("chunk", x) and writer.drain()
    assert writer.written == 1  # an entry already there is not written again
    reader = file_storage(tmp_path)  # another instance, same directory
    assert torch.equal(reader.get("chunk", torch.empty_like(x)), x)
    assert reader.get("other", torch.empty_like(x)) is None and reader.state() == "up"

    path = writer._io.path(writer.storage_key("chunk"))
    good = open(path, "rb").read()
    # an entry of other settings under our key (as if written by another configuration): a miss, kept
    foreign = envelope(x, "other-settings").numpy().tobytes()
    open(path, "wb").write(foreign)
    with caplog.at_level(logging.WARNING):
        assert reader.get("chunk", torch.empty_like(x)) is None
        assert reader.get("chunk", torch.empty_like(x)) is None
    assert caplog.text.count("another model") == 1 and reader.rejected == 2  # logged once
    assert reader.put("chunk", x) and reader.drain()
    assert open(path, "rb").read() == foreign  # never deleted nor overwritten

    # an entry that claims our settings but is damaged: a miss, kept, replaced by our next write
    for damage, why in (("flip", "checksum mismatch"), ("truncate", "expected")):
        data = bytearray(good)
        if damage == "flip":
            data[-5] ^= 0xFF
        open(path, "wb").write(bytes(data if damage == "flip" else data[:100]))
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            assert reader.get("chunk", torch.empty_like(x)) is None
        assert why in caplog.text and "kept" in caplog.text
        assert reader.drain() and os.path.exists(path)  # not deleted on read
        assert reader.put("chunk", x) and reader.drain()
        assert torch.equal(reader.get("chunk", torch.empty_like(x)), x)  # replaced by a sound entry
    assert reader.rejected == 4


def test_an_entry_without_a_valid_hmac_is_a_miss_and_kept(tmp_path, caplog):
    x = kv(2)
    signer = file_storage(tmp_path, "fp", secret=b"s3cret")
    assert signer.put("chunk", x) and signer.drain()
    assert torch.equal(file_storage(tmp_path, "fp", secret=b"s3cret").get("chunk", torch.empty_like(x)), x)
    # instances without the secret, or with another, use other keys: a plain miss, nothing touched
    assert file_storage(tmp_path, "fp").get("chunk", torch.empty_like(x)) is None
    assert file_storage(tmp_path, "fp", secret=b"other").get("chunk", torch.empty_like(x)) is None
    # a writer without the secret forges an entry under the signed key
    path = signer._io.path(signer.storage_key("chunk"))
    forged = envelope(kv(3), "fp").numpy().tobytes()
    open(path, "wb").write(forged)
    reader = file_storage(tmp_path, "fp", secret=b"s3cret")
    with caplog.at_level(logging.WARNING):
        assert reader.get("chunk", torch.empty_like(x)) is None
        assert reader.get("chunk", torch.empty_like(x)) is None
    assert caplog.text.count("authentication failed") == 1 and reader.rejected == 2
    assert open(path, "rb").read() == forged  # a miss, not a deletion


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
    assert s.drain() and sorted(io.entries) == sorted(s.storage_key(k) for k in ("k0", "k1"))


def test_any_other_backend_goes_through_its_hicache_methods(tmp_path, caplog):
    """SGLang's `dynamic` backend naming its own HiCacheFile class: the generic path, on a real backend."""
    extra = {"backend_name": "files", "module_path": "sglang.srt.mem_cache.hicache_storage",
             "class_name": "HiCacheFile", "file_storage_path": str(tmp_path)}
    x = kv(5)
    writer, reader = (Storage("dynamic", extra, "fp", timeout=READ_S) for _ in range(2))
    assert writer.connected() and reader.connected()
    assert type(writer._io) is backends.HiCacheIO
    assert writer.put("chunk", x) and writer.drain() and writer.written == 1
    assert torch.equal(reader.get("chunk", torch.empty_like(x)), x)
    assert reader.get("absent", torch.empty_like(x)) is None and reader.state() == "up"
    other_model = Storage("dynamic", extra, "other-model", timeout=READ_S)
    assert other_model.connected()
    assert other_model.get("chunk", torch.empty_like(x)) is None and other_model.rejected == 0  # another key
    writer._io.write(other_model.storage_key("chunk"), envelope(x, "model-x"))
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

    s = Storage("broken", {}, "fp", io=backends.HiCacheIO(Broken()))
    with caplog.at_level(logging.WARNING):
        assert s.get("chunk", torch.empty_like(kv(0))) is None
    assert "unavailable: get: ConnectionError: gone" in caplog.text and s.state() == "down"


def test_settings_choose_the_backend(monkeypatch, tmp_path):
    from sglang_mepic import config, env

    assert storage.from_settings("fp", env.Settings.from_env({})) is None
    given = {config.STORAGE_DIR.env: str(tmp_path), config.STORAGE_TIMEOUT.env: "0.25"}
    s = storage.from_settings("fp", env.Settings.from_env(given))
    assert s.backend == "file" and s.timeout == 0.25 and s.connected()
    assert s.put("k", kv(7)) and s.drain() and len(list(tmp_path.glob(s.storage_key("k") + "*.bin"))) == 1
    mooncake = env.Settings.from_env({**given, config.STORAGE_BACKEND.env: "mooncake"})
    assert mooncake.storage_backend == "mooncake"  # (not connected here: there is no master)


class _Group:
    """A TP group as SGLang's GroupCoordinator shows it: this process's rank in it and its size."""

    def __init__(self, rank: int, size: int):
        self.rank_in_group, self.world_size = rank, size


def test_each_tp_rank_keys_its_own_entries(monkeypatch, tmp_path):
    """Rank 1 of a TP-2 server holds its own heads of every page: its settings say (1, 2), so its storage keys
    and its settings fingerprint are its own, and SGLang's HiCache backend is made with the same rank (HiCacheFile
    suffixes each file `_<model>_<tp_rank>_<tp_size>`). Before, the rank was imported from where SGLang 0.5.23
    does not export it, the ImportError was swallowed, and every rank called itself rank 0 of 1."""
    from sglang.srt.distributed import parallel_state

    from sglang_mepic import config, env

    settings = env.Settings.from_env({config.STORAGE_DIR.env: str(tmp_path)})
    alone = storage.settings_known("fp", settings)
    assert (alone["tp_rank"], alone["tp_size"]) == (0, 1)  # no TP group in this process: one rank
    monkeypatch.setattr(parallel_state, "_TP", _Group(1, 2))
    monkeypatch.setattr(parallel_state, "_PP", _Group(0, 1))
    monkeypatch.setattr(parallel_state, "get_tp_group", lambda: _Group(1, 2))
    known = storage.settings_known("fp", settings)
    assert (known["tp_rank"], known["tp_size"]) == (1, 2)
    s = storage.from_settings("fp", settings)
    try:
        assert s.connected() and s.settings["tp_rank"] == 1 and s.settings["tp_size"] == 2
        s.bind(page_size=PAGE, kv_dtype="torch.float32/torch.float32")
        assert s.fingerprint == storage.settings_fingerprint(**{**alone, "tp_rank": 1, "tp_size": 2,
                                                                "page_size": PAGE,
                                                                "kv_dtype": "torch.float32/torch.float32"})
        assert s.put("chunk", kv(3)) and s.drain()
        assert [p.name for p in tmp_path.glob("*.bin")] == [f"{s.storage_key('chunk')}_mepic_1_2.bin"]
    finally:
        s.close()


def test_a_tp_rank_that_cannot_be_read_is_an_error(monkeypatch):
    """Only "no TP group in this process" means rank 0 of 1; SGLang's module missing is an error, not rank 0."""
    import sys

    from sglang_mepic import env

    monkeypatch.setitem(sys.modules, "sglang.srt.distributed.parallel_state", None)  # as where it is not
    with pytest.raises(ImportError):
        storage.settings_known("fp", env.Settings.from_env({}))
