"""Two instances behind sglang-router sharing chunk KV through Mooncake Store (launch_cluster),
all real processes on loopback, stopped at the end. The tests run in file order: the last two
stop the master and kill an instance."""

import json
import re
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_mepic.lang import chunk
from sglang_mepic.launch.cluster import Cluster
from sglang_mepic.process.mooncake_master import MasterError, check_client
from sglang_mepic.tiers.backends import MooncakeIO
from sglang_mepic.tiers.envelope import _HEADER, envelope

HEADER_BYTES = _HEADER.size

WORDS = open(json.__file__).read().split() + open(re.__file__).read().split()
BLOCK = 16        # tokens in a chunk's first block (one page)
KILL_AT = 3.0     # seconds into the load when instance A is killed


def doc(i: int, words: int = 120) -> str:
    start = (i * 613) % (len(WORDS) - words)
    return " ".join(WORDS[start:start + words])


def prompt(*docs: str) -> str:
    return "Answer from the documents.\n" + "".join(chunk(d) for d in docs) + "\nWhat is it about?"


def generate(url: str, text: str, **extra) -> requests.Response:
    return requests.post(url + "/generate", timeout=300, json={
        "text": text, "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}, **extra})


def mepic(url: str) -> dict:
    return requests.get(url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def wait_until(check, timeout: float = 60.0, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)
    return result


def store_keys(cluster) -> set[str]:
    """The chunk entries Mooncake's master knows (its admin endpoint), by key."""
    config = cluster.master.storage_config()
    text = requests.get(f"http://127.0.0.1:{config['master_metrics_port']}/get_all_keys", timeout=10).text
    return set(re.findall(r"\b[0-9a-f]{32}\b", text))


@pytest.fixture(scope="module")
def cluster(tiny_model):
    try:
        check_client()
    except MasterError as e:
        pytest.fail(str(e))  # installed by the project's set-up: missing is a defect, not a skip
    with Cluster(tiny_model, instances=2, storage="mooncake", policy="round_robin", segment=256 << 20,
                 server_args=("--dtype", "float32", "--mepic-storage-timeout", "1")) as c:
        for s in c.servers:
            wait_until(lambda: mepic(s.url)["storage_state"] == "up")
        yield c


@pytest.mark.timeout(400)  # includes the cluster's start
def test_a_chunk_compiled_on_one_instance_is_used_by_another(cluster):
    a, b = (s.url for s in cluster.servers)
    text = prompt(doc(1), doc(2))
    written = mepic(a)["storage_written"]
    first = generate(a, text).json()["meta_info"]
    assert first["mepic_residency"] == ["absent", "absent"]
    wait_until(lambda: mepic(a)["storage_written"] == written + 2)
    again = generate(b, text).json()
    meta = again["meta_info"]
    assert meta["mepic_residency"] == ["storage", "storage"]
    assert again["output_ids"] == generate(a, text).json()["output_ids"]
    # B compiles nothing; it computes the prompt around the chunks and each chunk's first block
    assert meta["mepic_compiled_tokens"] == 0 < first["mepic_compiled_tokens"]
    around = meta["prompt_tokens"] - first["mepic_compiled_tokens"]  # a compile computes its chunk's real tokens
    assert 2 * BLOCK < meta["mepic_recomputed_tokens"] <= around + 2 * BLOCK
    assert mepic(b)["tier_loads_storage"] >= 2


@pytest.mark.timeout(120)
def test_tenants_never_share_chunks_across_instances(cluster):
    a, b = (s.url for s in cluster.servers)
    text = prompt(doc(3), doc(4))
    written = mepic(a)["storage_written"]
    assert generate(a, text, extra_key="tenant-1").json()["meta_info"]["mepic_residency"] == ["absent", "absent"]
    wait_until(lambda: mepic(a)["storage_written"] == written + 2)
    for other in ({"extra_key": "tenant-2"}, {"cache_salt": "salt"}, {}):
        assert generate(b, text, **other).json()["meta_info"]["mepic_residency"] == ["absent", "absent"], other
    assert generate(b, text, extra_key="tenant-1").json()["meta_info"]["mepic_residency"] == ["storage"] * 2


@pytest.mark.timeout(120)
def test_a_corrupt_or_foreign_entry_in_the_store_is_rejected_never_loaded(cluster):
    from sglang_mepic.tiers.storage import Storage

    a, b = (s.url for s in cluster.servers)
    text = prompt(doc(5))
    before = store_keys(cluster)
    first = generate(a, text).json()
    (key,) = wait_until(lambda: store_keys(cluster) - before)
    client = Storage("mooncake", cluster.master.storage_config(), "test")
    assert client.connected()
    io: MooncakeIO = client._io
    good = io.client.get(key)
    for damage, why in (("flip", "checksum mismatch"), ("foreign", "another model")):
        data = bytearray(good)
        if damage == "flip":
            data[len(data) // 2] ^= 0xFF
        else:  # another model's envelope of the same size
            import torch
            payload = torch.frombuffer(bytearray(good[HEADER_BYTES:]), dtype=torch.uint8)
            data = bytearray(envelope(payload, "another-model").numpy().tobytes())
        assert io.client.remove(key, True) == 0 and io.client.put(key, bytes(data)) == 0
        log_start = len(cluster.servers[1].log())
        meta = generate(b, text).json()
        assert meta["meta_info"]["mepic_residency"] == ["absent"]  # computed, never loaded
        assert meta["output_ids"] == first["output_ids"]
        assert why in cluster.servers[1].log()[log_start:]
        assert requests.post(b + "/flush_cache", timeout=60).status_code == 200
    assert mepic(b)["storage_rejected"] == 2


@pytest.mark.timeout(240)
def test_a_stopped_master_is_a_logged_miss_and_is_used_again_when_back(cluster):
    a, b = (s.url for s in cluster.servers)
    cluster.master.stop()
    texts = [prompt(doc(10 + 2 * i), doc(11 + 2 * i)) for i in range(3)]
    for url in (a, b):
        for text in texts:
            reply = generate(url, text)
            assert reply.status_code == 200 and reply.json()["meta_info"]["completion_tokens"] == 8
    for s in cluster.servers:
        assert "MEPIC storage (mooncake) unavailable" in s.log()
        assert mepic(s.url)["storage_state"] == "down"
    cluster.master.start()  # the same ports; it has forgotten every object

    def shared_again():
        text = prompt(doc(int(time.monotonic() * 10) % 5000 + 100))
        generate(a, text)
        return generate(b, text).json()["meta_info"]["mepic_residency"] == ["storage"]
    wait_until(shared_again, timeout=90, every=1.0)
    assert all("MEPIC storage (mooncake) answers again" in s.log() for s in cluster.servers[:1])


@pytest.mark.timeout(300)
def test_killing_an_instance_under_load_fails_only_its_requests(cluster):
    """Requests through the router while instance A is killed: A's may fail (cleanly, with an
    HTTP error) or be retried; B serves every other request, and gives every page back."""
    a, b = cluster.servers
    texts = [prompt(doc(300 + i), doc(301 + i)) for i in range(40)]

    def send(i):
        time.sleep(0.25 * i)
        try:
            return generate(cluster.url, texts[i]).status_code
        except requests.RequestException as e:
            return type(e).__name__

    with ThreadPoolExecutor(len(texts)) as pool:
        futures = [pool.submit(send, i) for i in range(len(texts))]
        time.sleep(KILL_AT)
        os.killpg(os.getpgid(a.proc.pid), signal.SIGKILL)
        statuses = [f.result() for f in futures]
    failed = [i for i, s in enumerate(statuses) if s != 200]
    assert all(isinstance(statuses[i], int) and statuses[i] >= 500 for i in failed), statuses  # clean errors
    assert all(0.25 * i < KILL_AT for i in failed), statuses  # only requests A held; later ones are served
    metrics = requests.get(b.url + "/metrics", timeout=30).text

    def counter(name):  # SGLang's labelled counters appear once first incremented
        return sum(float(v) for v in re.findall(rf"^sglang:{name}\{{[^}}]*\}} ([0-9.e+]+)$", metrics, re.M))
    assert counter("num_requests_total") > 0 and counter("num_aborted_requests_total") == 0  # none of B's failed
    wait_until(lambda: requests.post(b.url + "/flush_cache", timeout=60).status_code == 200, timeout=60)
    state = mepic(b.url)
    assert state["kv_pages_free"] == state["kv_pages_total"]
    assert generate(cluster.url, prompt(doc(999))).status_code == 200  # the cluster still serves, through B
