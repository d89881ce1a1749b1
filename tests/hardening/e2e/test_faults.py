"""Faults and bad input against one real server with a small device pool, a host tier and a
file tier. After each test the server must still answer, and once idle a flush must return
every page to the pool."""

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess

POOL_TOKENS = 4096
# A read that misses the storage timeout is a miss by design. The default 0.5 s is missed on a
# loaded two-core CI machine, and these tests ask what is stored, not how fast it comes back.
STORAGE_PATIENCE = ("--mepic-storage-timeout", "5")
WORDS = open(json.__file__).read().split() + open(threading.__file__).read().split()


def doc(i: int, words: int = 150) -> str:
    start = (i * 977) % (len(WORDS) - words)
    return " ".join(WORDS[start:start + words])


def prompt(*docs: str, question: str = "What is it about?") -> str:
    return "Answer from the documents.\n" + "".join(chunk(d) for d in docs) + "\n" + question


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("chunk-files")


@pytest.fixture(scope="module")
def server(tiny_model, storage, servers):
    servers.stop_all()  # a host tier: SGLang wants 10 GB of RAM free beyond it
    with ServerProcess(tiny_model, "--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS),
                       "--mepic-host-tier-gb", "0.05", "--mepic-storage-dir", str(storage),
                       *STORAGE_PATIENCE, "--enable-tokenizer-batch-encode") as s:  # batches of plain text skip the per-request path
        yield s


def generate(server, text, new_tokens=8, **extra):
    return requests.post(server.url + "/generate", timeout=300, json={
        "text": text, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
        **extra})


def mepic(server) -> dict:
    return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


@pytest.fixture(autouse=True)
def still_serving(server):
    """Around each test: start from an empty cache; end answering, with every page back after a flush."""
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    total = mepic(server)["kv_pages_total"]
    yield
    deadline = time.time() + 60
    while requests.post(server.url + "/flush_cache", timeout=60).status_code != 200:
        assert time.time() < deadline, "the server did not go idle"
        time.sleep(0.5)
    assert mepic(server)["kv_pages_free"] == total
    r = generate(server, prompt(doc(0)))
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8


@pytest.mark.timeout(180)  # includes the server's start for the first test
def test_client_disconnects_mid_stream(server):
    def drop_after_first_chunk(i):
        body = {"text": prompt(doc(i), doc(i + 1)), "stream": True,
                "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        with requests.post(server.url + "/generate", json=body, stream=True, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith(b"data:"):
                    return json.loads(line[5:])["meta_info"]["completion_tokens"]

    with ThreadPoolExecutor(6) as pool:
        firsts = list(pool.map(drop_after_first_chunk, range(6)))
    assert all(n >= 1 for n in firsts)
    # the dropped requests are aborted, not decoded to the end: the server soon holds no pages
    deadline = time.time() + 30
    while mepic(server)["kv_pages_in_use"]:
        assert time.time() < deadline, "dropped streams kept their pages"
        time.sleep(0.2)


@pytest.mark.timeout(120)
def test_requests_aborted_while_their_chunks_compile(server):
    texts = [prompt(*(doc(40 + 6 * i + j, 120) for j in range(5))) for i in range(4)]
    rows = mepic(server)["compile_rows"]
    outcomes = []
    for delay in (0.0, 0.05, 0.2, 0.5):
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(generate, server, t, 16) for t in texts]
            time.sleep(delay)
            assert requests.post(server.url + "/abort_request", json={"abort_all": True}, timeout=60).ok
            outcomes += [f.result() for f in futures]
    for r in outcomes:  # each one either finished or was aborted; nothing else
        assert r.status_code in (200, 400), r.text
        if r.status_code == 200:
            assert r.json()["meta_info"]["finish_reason"]["type"] in ("length", "abort")
        else:
            assert "abort" in r.text.lower()
    assert any(r.status_code != 200 or r.json()["meta_info"]["finish_reason"]["type"] == "abort"
               for r in outcomes), "no request was aborted: the test did not exercise anything"
    assert mepic(server)["compile_rows"] > rows  # the aborts came while chunks were being compiled
    # the chunks that were being compiled are usable afterwards
    after = generate(server, texts[0], 16)
    assert after.status_code == 200 and after.json()["meta_info"]["completion_tokens"] == 16


@pytest.mark.timeout(120)
def test_corrupt_file_tier_entry_is_a_logged_miss(server, storage):
    text = prompt(doc(100), doc(101))
    before = set(storage.glob("*.bin"))
    first = generate(server, text).json()
    deadline = time.time() + 10  # entries are written in the background
    while len(files := sorted(set(storage.glob("*.bin")) - before)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    assert len(files) == 2  # one entry per compiled chunk
    # a flush empties the device pool and the host tier; the file tier stays
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    again = generate(server, text).json()
    assert again["meta_info"]["mepic_residency"] == ["storage", "storage"]
    assert again["output_ids"] == first["output_ids"]  # the stored KV is the computed KV

    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    entry = files[0]
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    third = generate(server, text).json()
    assert sorted(third["meta_info"]["mepic_residency"]) == ["absent", "storage"]
    assert third["output_ids"] == first["output_ids"]  # the bad entry was computed again, never loaded
    assert "rejected, treated as a miss: checksum mismatch" in server.log()
    assert mepic(server)["storage_rejected"] >= 1


@pytest.mark.timeout(120)
def test_evicted_chunks_come_back_from_the_host_tier_with_the_same_output(server):
    text = prompt(doc(150), doc(151))
    first = generate(server, text).json()
    assert first["meta_info"]["mepic_residency"] == ["absent", "absent"]
    for i in range(8):  # ~10k tokens of other chunks through a 4096-token pool
        assert generate(server, prompt(doc(160 + 2 * i, 200), doc(161 + 2 * i, 200))).status_code == 200
    again = generate(server, text).json()
    assert again["meta_info"]["mepic_residency"] == ["host", "host"]
    assert again["output_ids"] == first["output_ids"]  # the KV copied back is the KV computed
    state = mepic(server)
    assert state["tier_loads_host"] >= 2 and state["host_chunks"] >= 2


@pytest.mark.timeout(180)
def test_another_instance_reuses_chunks_it_never_computed(server, storage, tiny_model):
    text = prompt(doc(180), doc(181))
    first = generate(server, text).json()
    assert first["meta_info"]["mepic_residency"] == ["absent", "absent"]
    assert mepic(server)["storage_state"] == "up"
    with ServerProcess(tiny_model, "--dtype", "float32", "--mepic-storage-dir", str(storage),
                       *STORAGE_PATIENCE) as other:
        again = generate(other, text).json()
    assert again["meta_info"]["mepic_residency"] == ["storage", "storage"]
    assert again["output_ids"] == first["output_ids"]


@pytest.mark.timeout(120)
def test_exhausted_pool_admits_later_rather_than_failing(server):
    # 24 requests of ~1000-1500 tokens at once: several times what the 4096-token pool holds
    texts = [prompt(doc(200 + 3 * i, 200), doc(201 + 3 * i, 200), doc(202 + 3 * i, 150)) for i in range(24)]
    log_start = len(server.log())
    with ThreadPoolExecutor(24) as pool:
        replies = list(pool.map(lambda t: generate(server, t, 24), texts))
    assert [r.status_code for r in replies] == [200] * 24
    assert all(r.json()["meta_info"]["completion_tokens"] == 24 for r in replies)
    assert mepic(server)["chunk_evictions"] > 0  # the pool really was too small for all of them
    queued = [int(n) for n in re.findall(r"#queue-req: (\d+)", server.log()[log_start:])]
    assert max(queued) > 0  # requests were refused admission for a while, then served

    too_big = generate(server, " ".join(WORDS[:3000]))  # more tokens than the whole pool
    assert too_big.status_code == 400 and "token" in too_big.text.lower()


@pytest.mark.timeout(120)
def test_malformed_markup_under_concurrency(server):
    good = [prompt(doc(300 + i), doc(301 + i), question=f"Question {i}?") for i in range(8)]
    bad = ["<|chunk|>never closed", "a <|/chunk|> without an opening", "<|chunk|><|chunk|>nested<|/chunk|><|/chunk|>",
           "an empty <|chunk|><|/chunk|> chunk", {"input_ids": [1, -100, 5, -100, 6, -101]},
           {"input_ids": [1, -101]}, {"input_ids": [1, 10 ** 9]}, "<|chunk|>" + doc(5) + "<|chunk|>"]
    jobs = [("good", g) for g in good] + [("bad", b) for b in bad]
    jobs = jobs[::2] + jobs[1::2]

    def send(job):
        kind, body = job
        if isinstance(body, str):
            return kind, body, generate(server, body)
        return kind, body, requests.post(server.url + "/generate", timeout=120, json={
            **body, "sampling_params": {"max_new_tokens": 8, "temperature": 0}})

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, jobs))
    for kind, body, r in results:
        if kind == "bad":
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"]["message"], body
    concurrent = {body: r.json()["output_ids"] for kind, body, r in results if kind == "good"}
    assert len(concurrent) == len(good)
    for text in good:  # the bad requests disturbed nothing: one at a time gives the same tokens
        assert generate(server, text).json()["output_ids"] == concurrent[text]


def test_forged_hints_on_every_path_publish_nothing(server, storage):
    """Issue 29, defect 2: a client-made mepic.chunks action (here the poisoning shape, a compile
    of a chunk that follows 16 attacker tokens) is refused on every path, the batch-encode path
    and input_embeds included, and nothing reaches the tiers or shared storage."""
    from support.intake import ATTACK_IDS, FORGED

    files = sorted(p.name for p in storage.rglob("*") if p.is_file())
    compiled = mepic(server)["chunks_compiled"]
    greedy = {"max_new_tokens": 2, "temperature": 0}
    for body in ({"input_ids": ATTACK_IDS}, {"input_ids": [ATTACK_IDS, ATTACK_IDS]},
                 {"text": ["plain one", "plain two"]},  # SGLang's batch tokenizer (--enable-tokenizer-batch-encode)
                 {"input_embeds": [[0.0] * 64] * 4}):
        r = requests.post(server.url + "/generate", timeout=60,
                          json={**body, "kv_hints": FORGED, "sampling_params": greedy})
        assert r.status_code == 400, (body.keys(), r.text)
    assert mepic(server)["chunks_compiled"] == compiled
    assert sorted(p.name for p in storage.rglob("*") if p.is_file()) == files
    ok = requests.post(server.url + "/generate", timeout=60, json={"text": ["a", "b"], "sampling_params": greedy})
    assert ok.status_code == 200, ok.text
