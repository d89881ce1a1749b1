"""A layout hint's mark is no bearer secret (intake.py): `--log-requests` writes no layout and no
mark, and a mark taken from anywhere authorises nothing but the identical request.

The mark used to be one random value per process, carried in each request's kv_hints,
which SGLang's request log wrote out: whoever read the log could forge any layout,
including a compile of a chunk after their own prefix (cache poisoning).
"""

import re

import pytest
import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.process.server_process import ServerProcess
from sglang_mepic.wire import hint
from sglang_mepic.wire.hint import MARK_KEY
from support.hint_seal import GREEDY


DOC = " ".join(f"fact{i} is {i * 7 % 13}." for i in range(24))


ATTACK_IDS = [7] * 16 + list(range(100, 132)) + [0]


MARK = re.compile(r"""['"]%s['"]:\s*['"]([0-9a-f]{16,})['"]""" % MARK_KEY)


@pytest.fixture(scope="module")
def server(tiny_model):
    with ServerProcess(tiny_model, "--dtype", "float32", "--log-requests", "--log-requests-level", "3",
                       "--enable-tokenizer-batch-encode") as s:
        yield s


def forged(mark: str) -> dict:
    return {"protocol_version": "1", "message_id": "x", "actions": [
        {"action_id": "a", "action_type": "mepic.chunks", "action_version": hint.VERSION,
         "payload": {"chunks": [[16, 48]], "pads": [[48, 1]], MARK_KEY: mark}}]}


def mepic(server) -> dict:
    return requests.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]["mepic"]


def test_the_request_log_holds_no_layout_and_no_mark(server):
    for body in ({"text": "Read: <|chunk|>" + DOC + "<|/chunk|> What is fact3?"},
                 {"text": ["<|chunk|>" + DOC + "<|/chunk|> a?", "<|chunk|>" + DOC + "<|/chunk|> b?"]},
                 {"text": "<|chunk|>" + DOC + "<|/chunk|> n?", "sampling_params": {**GREEDY, "n": 2}},
                 {"input_ids": [5, BEG, *range(100, 160), END, 6]}):  # id markup: logged undecoded
        r = requests.post(server.url + "/generate", json={"sampling_params": GREEDY, **body}, timeout=120)
        assert r.status_code == 200, r.text
        assert "mepic_chunks" in r.text, "the request was not chunked"
        assert hint.HINT_TYPE not in r.text and not MARK.search(r.text), "a response carries a hint or its mark"
    # Chat markup reaches the tokenizer as ids with chunk markers, which level 2 and up decoded for the
    # log, and raised on (a 500; sglang_mepic/patches/tokenizer/request_logger_log_received_request.py).
    for path, body in (("/v1/completions", {"prompt": "<|chunk|>" + DOC + "<|/chunk|> c?"}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "<|chunk|>" + DOC + "<|/chunk|> d?"}]})):
        r = requests.post(server.url + path, json={"model": "tiny", "max_tokens": 2, **body}, timeout=120)
        assert r.status_code == 200, r.text
        assert hint.HINT_TYPE not in r.text and not MARK.search(r.text), "a response carries a hint or its mark"
    assert mepic(server)["chunks_compiled"] >= 1, "no chunk was compiled: the log was not put to the test"
    log = server.log()
    assert "Finish: obj=" in log and "Receive: obj=" in log, "the request log is not on"
    assert "mepic.chunks" not in log, "the request log writes layout hints"
    assert not MARK.search(log), "the request log writes a hint's mark"


def test_a_mark_replayed_on_a_forged_hint_is_refused_on_every_path(server):
    """Marks found anywhere in the log (none, now) and mark-shaped guesses, on every path a
    kv_hints field reaches: a 400 each, nothing compiled, nothing stored."""
    marks = set(MARK.findall(server.log())) | {"0" * 64, "f" * 32}
    assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
    before = mepic(server)
    for mark in marks:
        hints = forged(mark)
        for body in ({"input_ids": ATTACK_IDS, "kv_hints": hints},
                     {"input_ids": [ATTACK_IDS, ATTACK_IDS[1:]], "kv_hints": hints},
                     {"text": ["plain one", "plain two"], "kv_hints": hints},  # batch tokenization
                     {"text": "plain", "kv_hints": hints},
                     {"input_ids": ATTACK_IDS, "kv_hints": hints, "sampling_params": {**GREEDY, "n": 2}},
                     {"input_embeds": [[0.0] * 64] * 4, "kv_hints": hints}):
            r = requests.post(server.url + "/generate", json={"sampling_params": GREEDY, **body}, timeout=120)
            assert r.status_code == 400, (body.keys(), r.text)
    # The OpenAI request models have no kv_hints field: SGLang drops it before building the request.
    for path, body in (("/v1/completions", {"prompt": ATTACK_IDS}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
        r = requests.post(server.url + path, json={"model": "tiny", "max_tokens": 2, "kv_hints": forged("0" * 64),
                                                  **body}, timeout=120)
        assert r.status_code == 200, r.text
    after = mepic(server)
    assert (after["chunks_compiled"], after["chunks_resident"]) == (before["chunks_compiled"], 0)
