"""/server_info's page anatomy on a real server (sglang_mepic/cache/anatomy.py): while requests that
share chunks run, every used page is in one category and the shared chunks show their readers; once
idle, nothing is held that an eviction could not free; after a flush, nothing is used."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from sglang_mepic.lang import chunk
from sglang_mepic.pages.anatomy import CATEGORIES

WORDS = open(json.__file__).read().split()
DOCS = [" ".join(WORDS[i * 150:i * 150 + 100]) for i in range(3)]  # several pages each


def anatomy(server) -> dict:
    state = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]
    return state["page_anatomy"]


def generate(server, text, tokens=96):
    r = requests.post(server.url + "/generate", timeout=300, json={
        "text": text, "sampling_params": {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def sample_while(server, work) -> list[dict]:
    samples, done = [], threading.Event()

    def poll():
        while not done.is_set():
            samples.append(anatomy(server))
            time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        work()
    finally:
        done.set()
        poller.join()
    return samples


def check_partition(a: dict) -> None:
    assert sum(a[k] for k in CATEGORIES) == a["used_pages"], a


def test_readers_of_shared_chunks_show_while_they_run_and_nothing_is_held_once_idle(tiny_server):
    server = tiny_server
    generate(server, "Warm the chunks: " + "".join(chunk(d) for d in DOCS) + " ok", tokens=1)  # stored once
    prompts = [f"Question {i}. " + "".join(chunk(DOCS[(i + j) % 3]) for j in range(3)) + f" Why {i}?"
               for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        samples = sample_while(server, lambda: list(pool.map(lambda p: generate(server, p), prompts)))
    for a in samples:
        check_partition(a)
    busy = [a for a in samples if a["running_requests"] >= 5]
    assert busy, f"no sample saw 5 requests running: {[a['running_requests'] for a in samples]}"
    assert max(a["chunk_read_5_plus"] for a in busy) > 0  # every prompt reads all three chunks
    assert max(a["private"] for a in busy) > 0  # first blocks, questions, decode
    assert max(a["pad_slots"] for a in busy) > 0  # chunks are padded to whole pages

    idle = anatomy(server)
    check_partition(idle)
    assert idle["running_requests"] == 0 and idle["waiting_requests"] == 0 and idle["used_pages"] > 0
    assert all(isinstance(a["waiting_requests"], int) and a["waiting_requests"] >= 0 for a in samples)
    assert idle["chunk_evictable"] > 0  # the three chunks, stored
    reading = [k for k in CATEGORIES if k not in ("chunk_evictable", "prefix_evictable")]
    assert all(idle[k] == 0 for k in reading), idle

    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    flushed = anatomy(server)
    assert flushed["used_pages"] == 0 and sum(flushed[k] for k in CATEGORIES) == 0, flushed


def test_a_server_with_sglangs_own_cache_reports_its_pages_too(servers):
    server = servers.get("--attention-backend", "torch_native", "--radix-cache-backend", "sglang")  # eval's vanilla
    with ThreadPoolExecutor(3) as pool:
        samples = sample_while(server, lambda: list(pool.map(
            lambda i: generate(server, f"Plain prompt {i}: " + DOCS[i]), range(3))))
    for a in samples:
        check_partition(a)
        assert all(a[k] == 0 for k in CATEGORIES if k.startswith("chunk") or k == "compile_rows"), a
    assert max(a["private"] for a in samples) > 0
    idle = anatomy(server)
    assert idle["used_pages"] == idle["prefix_evictable"] > 0  # the tree's cache, nothing else
