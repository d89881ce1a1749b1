"""Aborted requests give their pages back without a flush, and nothing is left waiting.

A server that is never flushed (production) must not lose pages to requests
aborted mid-flight: in the waiting queue, planned, copying stored KV (CacheBlend),
mid chunked prefill or decoding. Found here (2026-11-27): under CacheBlend a request that
reached the scheduler around an `abort_all` stayed in the waiting queue for ever. The
abort only set the stage: every chunk of the request was stored, and CacheBlend holds its
chunks' stored pages beside slots for its whole prompt, which here need more than the
pool (residency.py, the pin budget).
"""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess

WORDS = open(json.__file__).read().split() + open(threading.__file__).read().split()


def doc(i: int, words: int = 120) -> str:
    start = (i * 977) % (len(WORDS) - words)
    return " ".join(WORDS[start:start + words])


def prompt(i: int) -> str:
    # 5 documents a request from a set of 8: requests share chunks at other positions.
    return "Answer from the documents.\n" + "".join(chunk(doc((i * 3 + j) % 8)) for j in range(5)) + "\nWhy?"


def mepic(server) -> dict:
    return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def generate(server, text, timeout=300):
    return requests.post(server.url + "/generate", timeout=timeout, json={
        "text": text, "sampling_params": {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}})


@pytest.fixture(scope="module")
def server(tiny_model, servers):
    servers.stop_all()  # a host tier: SGLang wants 10 GB of RAM free beyond it
    # A pool of 160 pages: a few requests fill it, so some wait, some are planned but not admitted, and
    # chunks are evicted to the host tier and loaded back while the abort comes.
    with ServerProcess(tiny_model, "--dtype", "float32", "--max-total-tokens", str(160 * 16),
                       "--chunked-prefill-size", "512", "--mepic-mode", "cacheblend-0.15",
                       "--mepic-host-tier-gb", "0.02") as s:
        yield s


@pytest.mark.timeout(300)
@pytest.mark.parametrize("delay", [0.0, 0.3, 1.0, 2.5])
def test_an_abort_gives_every_page_back_without_a_flush(server, delay):
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    total = mepic(server)["kv_pages_free"]
    with ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(generate, server, prompt(i)) for i in range(12)]
        time.sleep(delay)
        assert requests.post(server.url + "/abort_request", json={"abort_all": True}, timeout=60).ok
        outcomes = [f.result() for f in futures]
    assert all(r.status_code in (200, 400) for r in outcomes), [r.text for r in outcomes if r.status_code >= 500]
    deadline = time.time() + 30
    while (stats := mepic(server))["kv_pages_in_use"]:
        assert time.time() < deadline, f"idle after an abort, {stats['kv_pages_in_use']} pages still in use: {stats}"
        time.sleep(0.3)
    # Idle and unflushed: what is not free is held loosely by the tree and the chunk store (evictable),
    # and a request that needs the whole pool gets it.
    again = generate(server, prompt(0))
    assert again.status_code == 200 and again.json()["meta_info"]["completion_tokens"] == 24
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    assert mepic(server)["kv_pages_free"] == total


@pytest.mark.timeout(300)
def test_a_request_whose_stored_chunks_and_prompt_need_more_than_the_pool_reuses_what_fits(server):
    # Its 5 chunks are stored after its first run; CacheBlend would hold them (about 100 pages) beside
    # slots for its prompt (about 100 more) in a pool of 160: it reuses the chunks that fit beside
    # them and computes the others, rather than wait for room no one can give.
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    first = generate(server, prompt(0), timeout=60)
    again = generate(server, prompt(0), timeout=60)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    meta = again.json()["meta_info"]
    assert meta["completion_tokens"] == 24
    assert "device" in meta["mepic_residency"] and "absent" in meta["mepic_residency"], meta
    assert 0 < meta["mepic_chunk_hits"] < 5, meta
