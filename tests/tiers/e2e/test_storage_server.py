"""Shared chunk storage (storage.py) without a server: HiCache's file backend, Mooncake Store
with a real master on loopback, and backends that are slow or fail."""

import logging
import time

import pytest
import torch

from sglang_mepic.tiers import storage
from sglang_mepic.tiers.envelope import envelope
from sglang_mepic.tiers.storage import Storage
from support.storage import PAGE, kv, master, mooncake_storage  # noqa: F401 (master: fixtures)


def test_mooncake_entries_are_shared_between_clients_and_checked(master, caplog):
    a, b = mooncake_storage(master), mooncake_storage(master)
    x = kv(4)
    assert a.put("chunk", x) and a.drain() and a.written == 1
    assert torch.equal(b.get("chunk", torch.empty_like(x)), x)
    assert b.get("absent", torch.empty_like(x)) is None and b.state() == "up"

    a._io.write(b.storage_key("foreign"), envelope(x, "model-b"))
    bad = envelope(x, "model-a")
    bad[-3] ^= 0xFF
    a._io.write(b.storage_key("corrupt"), bad)
    a._io.write(b.storage_key("short"), envelope(x[:, :, :PAGE], "model-a"))
    with caplog.at_level(logging.WARNING):
        for key, why in (("foreign", "another model"), ("corrupt", "checksum mismatch"), ("short", "expected")):
            assert b.get(key, torch.empty_like(x)) is None
            assert why in caplog.text
    assert b.rejected == 3 and b.drain()
    keys = [b.storage_key(k) for k in ("foreign", "corrupt", "short")]
    assert all(a._io.exists(k) for k in keys)  # a miss, never a deletion
    assert b.put("corrupt", x) and b.put("foreign", x) and b.drain()  # ours but damaged: replaced; foreign: kept
    assert torch.equal(a.get("corrupt", torch.empty_like(x)), x) and a.get("foreign", torch.empty_like(x)) is None


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


def test_a_master_that_cannot_be_reached_at_start_is_a_logged_miss(caplog, monkeypatch):
    from sglang_mepic.process.server_process import free_port

    # Mooncake's client tries 20 ports, 4.3 s each, before it gives up (86 s); how often it retries is its
    # business, not this test's.
    monkeypatch.setenv("MC_STORE_CLIENT_SETUP_RETRIES", "1")

    port = free_port()
    config = {"master_server_address": f"127.0.0.1:{port}", "metadata_server": f"http://127.0.0.1:{port}/metadata",
              "protocol": "tcp", "local_hostname": "127.0.0.1", "global_segment_size": 16 << 20}
    with caplog.at_level(logging.WARNING):
        s = Storage("mooncake", config, "fp")
        assert not s.connected(timeout=120)
        assert s.get("chunk", torch.empty_like(kv(0))) is None and not s.put("chunk", kv(0))
    assert "unavailable: cannot connect" in caplog.text and s.state() == "down"


# ---- two real servers of different settings on one directory --------------------

@pytest.mark.timeout(400)
def test_servers_of_other_settings_share_a_directory_and_keep_hitting_their_own(tiny_model, tmp_path):
    """Issue 29, defect 4: recompute blocks 1 and 2 store chunks of other sizes. Issue 73: a float32 KV
    cache and an fp8 one (the first and the third server, alike but for it) store other bytes for the
    same chunk. Each server must keep loading its own entries: none is read by another, rejected as
    corrupt or deleted."""
    import json as _json
    from contextlib import ExitStack

    import requests

    from sglang_mepic.lang import chunk
    from sglang_mepic.process.server_process import ServerProcess

    words = open(_json.__file__).read().split()
    docs = [" ".join(words[i * 300:i * 300 + 120]) for i in range(3)]  # several pages each
    text = "Answer from the documents.\n" + chunk(docs[0]) + chunk(docs[1]) + "\nWhat is it about?"

    def generate(server, text):
        return requests.post(server.url + "/generate", timeout=300, json={
            "text": text, "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}})

    def mepic(server):
        return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]

    def flush(server):
        assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200

    common = ("--dtype", "float32", "--mepic-storage-dir", str(tmp_path), "--mepic-recompute-blocks")
    with ExitStack() as stack:
        servers = [ServerProcess(tiny_model, *common, "1", "--mepic-max-chunks", "2"),
                   ServerProcess(tiny_model, *common, "2"),
                   ServerProcess(tiny_model, *common, "1", "--kv-cache-dtype", "fp8_e5m2")]
        for server in servers:  # started together: their imports overlap
            server.launch()
            stack.callback(server.stop)
        for server in servers:
            server.wait_ready()
        one = servers[0]
        first = {}
        for server in servers:
            reply = generate(server, text).json()
            assert reply["meta_info"]["mepic_residency"] == ["absent", "absent"]  # not the other's entries
            first[server.url] = reply["output_ids"]
        deadline = time.time() + 20  # entries are written in the background
        while len(list(tmp_path.glob("*.bin"))) < 6 and time.time() < deadline:
            time.sleep(0.2)
        files = sorted(tmp_path.glob("*.bin"))
        assert len(files) == 6  # two chunks, three settings: six entries side by side
        for _ in range(2):
            for server in servers:
                flush(server)  # device pool and host tier emptied; the directory stays
                reply = generate(server, text).json()
                assert reply["meta_info"]["mepic_residency"] == ["storage", "storage"]
                assert reply["output_ids"] == first[server.url]
        assert sorted(tmp_path.glob("*.bin")) == files  # nothing deleted
        for server in servers:
            state = mepic(server)
            assert state["storage_rejected"] == 0 and state["tier_loads_storage"] == 4, state
            assert "rejected" not in server.log()

        # defect 7: more chunks than --mepic-max-chunks is a 400 naming the count and the flag
        three = "Q.\n" + chunk(docs[0]) + chunk(docs[1]) + chunk(docs[2]) + "\nWhy?"
        refused = generate(one, three)
        assert refused.status_code == 400, refused.text
        assert "marks 3 chunks" in refused.text and "--mepic-max-chunks" in refused.text
        assert generate(one, text).status_code == 200  # still serving
