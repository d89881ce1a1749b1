"""The private-copy baselines copy where the pool binds (issue 86): EPIC's requests are charged the
pages of their private copy at admission and wait for them in SGLang's queue; none reads the store's
pages in place. Real servers, tiny model, float32, a KV pool of 64 pages.

On the old code a request was admitted on the pages it computes, and one that then found no room for
its copy read the store's pages (`private_copy_fallbacks`): 8 concurrent readers of one chunk gave 6.
"""

import random
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, CHUNK_END_ID

B = 16
POOL_PAGES = 64
MAX_NEW = 8


def ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(10, 4000) for _ in range(n)]


# 20 pages: pinned (20) beside one reader's whole prompt (about 22) fits the 64; two readers' copies
# (19 each) beside the store's pages do not, so the second of two concurrent readers must wait.
CHUNK = ids(20 * B, 7)
INSTRUCTION = ids(11, 100)


def prompt(k):
    return INSTRUCTION + [CHUNK_BEGIN_ID, *CHUNK, CHUNK_END_ID] + ids(9, 1000 + k)


def generate(server, input_ids):
    r = requests.post(server.url + "/generate", timeout=300, json={
        "input_ids": input_ids, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    return r.json()


def stats(server):
    return requests.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]["mepic"]


def flush(server):
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200


@pytest.fixture(scope="module")
def small_epic(servers):
    # A host tier, as the capacity runs have: a chunk evicted from the pool is loaded back when planned.
    return servers.get("--mepic-mode", "epic-16", "--max-total-tokens", str(POOL_PAGES * B),
                       "--mepic-host-tier-gb", "0.05")


@pytest.mark.server
def test_concurrent_readers_of_one_chunk_each_copy_it_and_answer_as_alone(small_epic):
    server = small_epic
    flush(server)
    before = stats(server)["private_copy_fallbacks"]
    generate(server, prompt(99))  # stores the chunk: the readers below find it
    readers = [prompt(k) for k in range(8)]
    with ThreadPoolExecutor(len(readers)) as pool:
        together = list(pool.map(lambda p: generate(server, p), readers))
    assert stats(server)["private_copy_fallbacks"] == before  # no reader read the store's pages in place
    # Each reused the chunk's pages after its first (its copy: SGLang's prefix) and computed the rest.
    copied = (len(CHUNK) // B - 1) * B
    assert [r["meta_info"]["cached_tokens"] for r in together] == [copied] * len(readers)
    alone = []
    for p in readers:
        flush(server)
        generate(server, prompt(99))
        alone.append(generate(server, p))
    assert [r["output_ids"] for r in together] == [r["output_ids"] for r in alone]


@pytest.mark.server
def test_a_chunk_whose_copy_can_never_fit_beside_it_is_computed_not_shared(small_epic):
    """40 pages stored + 39 copied + the rest of the prompt exceed the 64: waiting would be for ever and
    sharing is what EPIC does not do, so the request computes the chunk in pages of its own."""
    server = small_epic
    flush(server)
    before = stats(server)["private_copy_fallbacks"]
    big = ids(40 * B, 8)
    marked = INSTRUCTION + [CHUNK_BEGIN_ID, *big, CHUNK_END_ID] + ids(9, 2000)
    first = generate(server, marked)
    # Another instruction: no prefix of the first request's either.
    second = generate(server, ids(11, 101) + marked[len(INSTRUCTION):-9] + ids(9, 2001))
    assert stats(server)["private_copy_fallbacks"] == before
    assert second["meta_info"]["cached_tokens"] < len(big) - B  # the chunk was not read from the store
    assert first["meta_info"]["completion_tokens"] == second["meta_info"]["completion_tokens"] == MAX_NEW


@pytest.mark.server
def test_a_copy_finds_the_room_its_budget_counted_when_a_later_request_of_its_round_pins_chunks(small_epic):
    """Two requests in one scheduling round: X reads chunk A (20 pages) and fits; Y, planned after X was
    counted, pins chunk B (24 pages: loaded back from the host tier into pages SGLang had counted as free for
    X) and does not fit. Y lets go of B before X copies A: X gets its copy, and reads nothing in place. On the
    code before, Y held B through X's copy, which found no room (1 fallback)."""
    server = small_epic
    flush(server)
    before = stats(server)["private_copy_fallbacks"]
    a, b = CHUNK, ids(24 * B, 9)
    x = INSTRUCTION + [CHUNK_BEGIN_ID, *a, CHUNK_END_ID] + ids(9, 3000)
    y = INSTRUCTION + [CHUNK_BEGIN_ID, *b, CHUNK_END_ID] + ids(9, 3001)
    generate(server, INSTRUCTION + [CHUNK_BEGIN_ID, *a, CHUNK_END_ID] + ids(9, 3002))  # stores A
    generate(server, INSTRUCTION + [CHUNK_BEGIN_ID, *b, CHUNK_END_ID] + ids(9, 3003))  # stores B
    r = requests.post(server.url + "/generate", timeout=300, json={  # one batch: both reach the same round
        "input_ids": [x, y], "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    assert stats(server)["private_copy_fallbacks"] == before
    assert all(o["meta_info"]["mepic_residency"] != ["absent"] for o in r.json())  # each found its chunk stored
    assert [o["meta_info"]["cached_tokens"] for o in r.json()] == [(len(a) // B - 1) * B, (len(b) // B - 1) * B]


# EPIC as on LMCache's CPU backend (`--mepic-chunk-store host`): the chunks live in the host tier only, and each
# request loads its copy straight into pages of its own; the pool holds no store beside the copies.
@pytest.fixture(scope="module")
def host_epic(servers):
    return servers.get("--mepic-mode", "epic-16", "--max-total-tokens", str(POOL_PAGES * B),
                       "--mepic-host-tier-gb", "0.05", "--mepic-chunk-store", "host")


@pytest.mark.server
def test_a_host_store_keeps_no_chunk_in_the_pool_and_each_reader_loads_a_copy_of_its_own(host_epic, small_epic):
    flush(host_epic)
    before = stats(host_epic)
    generate(host_epic, prompt(99))  # compiles the chunk, which goes to the host tier
    assert stats(host_epic)["chunks_resident"] == 0
    readers = [prompt(k) for k in range(8)]
    with ThreadPoolExecutor(len(readers)) as pool:
        together = list(pool.map(lambda p: generate(host_epic, p), readers))
    after = stats(host_epic)
    assert after["private_copy_fallbacks"] == before["private_copy_fallbacks"]
    assert after["chunks_resident"] == 0
    assert after["tier_loads_host"] - before["tier_loads_host"] >= len(readers)  # a load a reader, none shared
    copied = (len(CHUNK) // B - 1) * B
    assert [r["meta_info"]["cached_tokens"] for r in together] == [copied] * len(readers)
    # The same KV as a copy of the pool's store: the same tokens as the pool-store server, each read alone.
    flush(small_epic)
    generate(small_epic, prompt(99))
    assert [r["output_ids"] for r in together] == [generate(small_epic, p)["output_ids"] for p in readers]


@pytest.mark.server
def test_a_chunk_too_big_to_copy_beside_its_stored_pages_is_read_from_the_host(host_epic, small_epic):
    """The 40-page chunk that the pool store cannot copy at 64 pages (the test above) needs only its copy here:
    it is reused, and nothing reads stored pages in place."""
    big = ids(40 * B, 8)
    marked = INSTRUCTION + [CHUNK_BEGIN_ID, *big, CHUNK_END_ID] + ids(9, 2000)
    second = ids(11, 101) + marked[len(INSTRUCTION):-9] + ids(9, 2001)
    results = {}
    for name, server in (("host", host_epic), ("pool", small_epic)):
        flush(server)
        before = stats(server)["private_copy_fallbacks"]
        generate(server, marked)
        results[name] = generate(server, second)
        assert stats(server)["private_copy_fallbacks"] == before
    assert results["host"]["meta_info"]["cached_tokens"] == (len(big) // B - 1) * B
    assert results["pool"]["meta_info"]["cached_tokens"] < len(big) - B
