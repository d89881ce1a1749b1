"""Issue 47: chunks are computed by the scheduler in the forward that needs them.

Before, every chunk of every request was first sent from the tokenizer side as an internal
compile request, and a request whose chunk was absent waited a prefill round for it. Now a
chunk no tier holds is a compile row in its first reader's own prefill batch
(sglang_mepic/cache/compile_rows.py). On a real server: one client request is one request to the
scheduler, a cold request gets its first token in one prefill round, concurrent readers of a
new chunk share one computation of it, and outputs are those of a warm cache in every case,
a chunk longer than the chunked-prefill budget and the private-copy modes included.
"""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests


GREEDY = {"max_new_tokens": 6, "temperature": 0}
DOC = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(30))
OTHER = " ".join(f"item{i} costs {i * 5 % 11}." for i in range(30))
LONG = " ".join(f"row{i} holds {i * 3 % 17} apples." for i in range(60))


def chunked(*docs, question="What is fact3?") -> str:
    return "Read: " + "".join(f"<|chunk|>{d}<|/chunk|>" for d in docs) + " " + question


def generate(server, text, **extra) -> dict:
    r = requests.post(server.url + "/generate", json={"text": text, "sampling_params": GREEDY, "return_logprob": True,
                                                      **extra}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def counter(server, name: str) -> float:
    text = requests.get(server.url + "/metrics", timeout=30).text
    values = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
    return sum(float(v) for v in values)


def flush(server) -> None:
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200


def answer(out: dict) -> tuple:
    """What a client reads: the tokens and their logprobs (float32 model)."""
    return out["text"], [round(x[0], 4) for x in out["meta_info"]["output_token_logprobs"]]


@pytest.fixture
def server(tiny_server):  # the launcher turns --enable-metrics on
    return tiny_server


def test_one_client_request_is_one_request_to_the_scheduler(server):
    flush(server)
    sent, received = counter(server, "sglang:num_requests_total"), counter(server, "sglang_mepic:requests_received")
    rows = counter(server, "sglang_mepic:compile_rows")
    out = generate(server, chunked(DOC, OTHER, LONG))
    assert out["meta_info"]["mepic_residency"] == ["absent"] * 3
    assert counter(server, "sglang:num_requests_total") - sent == 1  # was 4: three compile requests before it
    assert counter(server, "sglang_mepic:requests_received") - received == 1
    assert counter(server, "sglang_mepic:compile_rows") - rows == 3


def test_a_cold_request_gets_its_first_token_in_one_prefill_round(server):
    flush(server)
    mark = len(server.log())
    out = generate(server, chunked(DOC, OTHER, question="What is item4?"))
    meta = out["meta_info"]
    assert meta["mepic_compiled_tokens"] > 0 and meta["cached_tokens"] == 0
    batches = re.findall(r"Prefill batch, #new-seq: (\d+)", server.log()[mark:])
    # One prefill forward: the request and the two compile rows it reads (it was two, compiles first).
    assert batches == ["3"], batches
    # What it read is what a warm cache holds: the same request again reuses both chunks.
    again = generate(server, chunked(DOC, OTHER, question="What is item4?"))
    assert again["meta_info"]["mepic_residency"] == ["device", "device"]
    assert answer(again) == answer(out)


def test_requests_arriving_together_share_one_computation_of_a_new_chunk(server):
    flush(server)
    rows = counter(server, "sglang_mepic:compile_rows")
    texts = [chunked(LONG, question=f"How many apples in row{i}?") for i in range(6)]
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda t: generate(server, t), texts))
    assert counter(server, "sglang_mepic:compile_rows") - rows == 1
    # Each output is what that request gets alone on a fresh cache.
    for text, out in zip(texts, outs):
        flush(server)
        assert answer(generate(server, text)) == answer(out), text


@pytest.mark.parametrize("flags", [("--chunked-prefill-size", "64"), ("--mepic-mode", "epic-16"),
                                   ("--mepic-mode", "cacheblend-0.15")], ids=lambda f: " ".join(f))
def test_cold_equals_warm_where_the_reader_waits_for_its_chunk(servers, flags):
    """A compile row longer than the chunked-prefill budget runs over several forwards, and EPIC and
    CacheBlend copy stored KV before their forward: their readers wait for the chunk to be stored
    instead of sharing the compile row's forward. Outputs do not depend on it."""
    s = servers.get(*flags)
    mark = len(s.log())  # a shared server: this test's part of its log
    text = chunked(LONG, DOC, question="How many apples in row7?")
    cold = generate(s, text)
    assert cold["meta_info"]["mepic_residency"] == ["absent", "absent"]
    warm = generate(s, text)
    assert warm["meta_info"]["mepic_residency"] == ["device", "device"]
    assert answer(warm) == answer(cold)
    assert "Traceback" not in s.log()[mark:]
