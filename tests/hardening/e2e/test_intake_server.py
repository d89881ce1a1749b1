"""What the server refuses before a request reaches the scheduler (sglang_mepic/frontend/intake.py).

One empty prompt took the whole server down (SmolLM2's tokenizer adds no BOS, so
`text: ""` reached the model as an extend of no tokens). Every shape of an empty
prompt, on every client path, is a 400 and the server keeps serving. So is a
`mepic.chunks` kv_hints action the server did not make, on every path: a forged
one could publish KV computed after an attacker's prefix under a chunk's key.
"""

import pytest
import requests

from support.intake import ATTACK_IDS, EMPTY, FORGED, GREEDY, send, still_serving


FORGED_HINTS = [
    ("/generate", {"input_ids": ATTACK_IDS, "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"input_ids": [ATTACK_IDS, ATTACK_IDS], "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": "plain text", "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": ["one", "two"], "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": "a <|chunk|>" + "doc " * 40 + "<|/chunk|> q", "kv_hints": FORGED}, None),
    ("/generate", {"input_ids": [1, 2, 3], "kv_hints": FORGED, "sampling_params": {**GREEDY, "n": 2}},
     "made by the server"),
]


@pytest.mark.parametrize("path,body,message", EMPTY + FORGED_HINTS)
def test_refused_and_the_server_keeps_serving(tiny_server, path, body, message):
    r = send(tiny_server, path, body)
    if message is None:
        # markup with a forged hint: the server's own layout replaces the client's action
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400, r.text
        assert message in r.text
    still_serving(tiny_server)


def mepic_stats(server):
    return requests.get(server.url + "/server_info", timeout=30).json()["internal_states"][0]["mepic"]


def test_a_forged_compile_publishes_nothing(tiny_server):
    """The poisoning shape, sent by a client: refused before the scheduler, so nothing is compiled."""
    assert requests.post(tiny_server.url + "/flush_cache", timeout=60).status_code == 200
    before = mepic_stats(tiny_server)
    for body in ({"input_ids": ATTACK_IDS, "kv_hints": FORGED}, {"input_ids": [ATTACK_IDS], "kv_hints": FORGED}):
        assert send(tiny_server, "/generate", body).status_code == 400
    # The OpenAI request models have no kv_hints field: SGLang drops it before building the request.
    for path, body in (("/v1/completions", {"prompt": ATTACK_IDS, "kv_hints": FORGED}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "kv_hints": FORGED})):
        assert send(tiny_server, path, body).status_code in (200, 400)
    after = mepic_stats(tiny_server)
    assert (after["chunks_compiled"], after["chunks_resident"]) == (before["chunks_compiled"], 0)
