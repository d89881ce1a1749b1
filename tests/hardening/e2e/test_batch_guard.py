"""A batch whose forward raises ends its requests with a 500, not the server (sglang_mepic/hardening/batch_guard.py).

The fault is injected where a real one happens, in the model worker's forward, for
requests whose rid starts with a given prefix (SGLANG_MEPIC_TEST_FAIL_RID_PREFIX),
on a server with the overlap scheduler (SGLang's default) and one without. After
each fault the server serves, answers a plain and a chunked request exactly as
before the faults, and a flush gives every page back.
"""

import pytest
import requests

from sglang_mepic.hardening.batch_guard import FAULT_ENV
from sglang_mepic.lang import chunk
from sglang_mepic.process.server_process import ServerProcess

GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
DOC = " ".join(f"item{i} costs {i * 3 % 17} coins." for i in range(40))  # several pages
PLAIN = "The quick brown fox"
CHUNKED = "Read this.\n" + chunk(DOC) + "\nWhat does item7 cost?"


@pytest.fixture(scope="module", params=["overlap", "no-overlap"])
def server(request, tiny_model):
    flags = ["--disable-overlap-schedule"] if request.param == "no-overlap" else []
    with ServerProcess(tiny_model, "--dtype", "float32", *flags,
                       env={FAULT_ENV: "boom,decode:late"}) as s:
        yield s


def generate(server, text, rid=None, n=None):
    body = {"text": text, "sampling_params": {**GREEDY, **({"n": n} if n else {})}}
    if rid is not None:
        body["rid"] = rid
    return requests.post(server.url + "/generate", json=body, timeout=120)


def mepic(server) -> dict:
    return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def outputs(server) -> list:
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    return [generate(server, text).json()["output_ids"] for text in (PLAIN, CHUNKED, CHUNKED)]


@pytest.mark.parametrize("rid, text", [("boom-plain", PLAIN), ("boom-chunked", CHUNKED),
                                       ("late-plain", PLAIN), ("late-chunked", CHUNKED)])
def test_a_failing_forward_ends_its_request_not_the_server(server, rid, text):
    before = outputs(server)
    r = generate(server, text, rid=rid)
    assert r.status_code == 500, r.text
    assert "InjectedFault" in r.json()["message"] and "the server goes on" in r.json()["message"]
    assert outputs(server) == before, "the outputs changed after a failed batch"
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    state = mepic(server)
    assert state["kv_pages_free"] == state["kv_pages_total"], "a failed batch kept pages"


def test_requests_outside_the_failing_batch_are_served(server):
    """A request already decoding when another's prefill fails is answered in full or with the
    same error (a decode batch holds both); one sent after it is answered, as alone."""
    from concurrent.futures import ThreadPoolExecutor

    alone = outputs(server)[0]
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(generate, server, PLAIN)
        failing = pool.submit(generate, server, "x y z", "boom-together")
        assert failing.result().status_code == 500
        kept = first.result()
    assert kept.status_code in (200, 500), kept.text
    if kept.status_code == 200:
        assert kept.json()["output_ids"] == alone
    assert generate(server, PLAIN).json()["output_ids"] == alone
