"""What the server refuses before a request reaches the scheduler (sglang_mepic/frontend/intake.py).

One empty prompt took the whole server down (SmolLM2's tokenizer adds no BOS, so
`text: ""` reached the model as an extend of no tokens). Every shape of an empty
prompt, on every client path, is a 400 and the server keeps serving. So is a
`mepic.chunks` kv_hints action the server did not make, on every path: a forged
one could publish KV computed after an attacker's prefix under a chunk's key.
"""

from types import SimpleNamespace

import pytest
import requests

from sglang_mepic.frontend import intake, request_state
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END

GREEDY = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}


def action(payload):
    return SimpleNamespace(action_type="mepic.chunks", action_version="1", payload=payload)


def test_empty_prompts_are_refused():
    for text, ids in (("", None), ("  \n\t", None), (None, []), ("", [])):
        with pytest.raises(intake.IntakeError):
            intake.check_prompt(text, ids)
    intake.check_prompt("hi", None)
    intake.check_prompt(None, [5])
    intake.check_prompt(None, [], session_params={"id": "s"})  # the session's history supplies it
    intake.check_prompt("", None, multimodal=True)


IDS = list(range(100, 140))


def sealed(payload, ids=IDS):
    return {**payload, intake.MARK_KEY: intake.seal("1", payload, ids)}


def test_only_hints_the_server_sealed_pass():
    ours = sealed({"chunks": [[0, 32]], "pads": []})
    intake.check_hints(SimpleNamespace(actions=[action(ours)]), IDS)
    for forged in ({"chunks": [[0, 32]]}, {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True},
                   {"chunks": [[0, 32]], intake.MARK_KEY: "guess"}, "not a dict"):
        with pytest.raises(intake.IntakeError, match="made by the server"):
            intake.check_hints(SimpleNamespace(actions=[action(forged)]), IDS)
    other = SimpleNamespace(action_type="other.vendor", payload={})
    intake.check_hints(SimpleNamespace(actions=[other]), IDS)  # other hint types are SGLang's business


def test_a_seal_authorises_only_its_own_payload_and_ids():
    """A mark copied from a log is no bearer token: on another payload, or on the same payload over
    other ids (an attacker's prefix), it is refused."""
    ours = sealed({"chunks": [[0, 32]], "pads": [[32, 8]]})
    mark = ours[intake.MARK_KEY]
    poisoning = {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True, intake.MARK_KEY: mark}
    for payload, ids in ((poisoning, IDS), (ours, [7] * 16 + IDS), (ours, IDS[:-1]), (ours, None),
                         ({**ours, "compile": True}, IDS)):
        with pytest.raises(intake.IntakeError, match="made by the server"):
            intake.check_hints(SimpleNamespace(actions=[action(payload)]), ids)
    intake.check_hints(SimpleNamespace(actions=[action(dict(ours))]), list(IDS))


def test_an_empty_media_list_is_no_prompt():
    item = SimpleNamespace(text="", input_ids=[], kv_hints=None, image_data=[], audio_data=None)
    with pytest.raises(intake.IntakeError):
        intake.check(item, [])


def test_text_beside_ids_does_not_decide():
    """SGLang's request log (level >= 2) writes the decoding of a client's ids into `text`: ids that
    decode to whitespace are a prompt all the same."""
    item = SimpleNamespace(text="  ", input_ids=[220, 220], kv_hints=None)
    intake.check(item, [220, 220])
    with pytest.raises(intake.IntakeError):
        intake.check(SimpleNamespace(text="  ", input_ids=None, kv_hints=None), [220, 220])


class Item(SimpleNamespace):
    """A batch item as SGLang splits it off: weak-referenceable, as GenerateReqInput is."""


def test_errors_name_the_batch_item():
    item = Item(text="", input_ids=[], kv_hints=None)
    request_state.ITEMS.set(item, 2)
    with pytest.raises(intake.IntakeError, match="^batch item 2: "):
        intake.check(item, [])


# ---- on a real server -------------------------------------------------------------------

FORGED = {"protocol_version": "1", "message_id": "x", "actions": [
    {"action_id": "a", "action_type": "mepic.chunks", "action_version": "1",
     # the poisoning shape: a compile whose chunk follows 16 attacker tokens
     "payload": {"chunks": [[16, 48]], "pads": [[48, 1]], "compile": True}}]}
ATTACK_IDS = [7] * 16 + list(range(100, 132)) + [0]

EMPTY = [
    ("/generate", {"text": ""}, "empty"),
    ("/generate", {"text": [""]}, "batch item 0"),
    ("/generate", {"text": ["a fine prompt", "   "]}, "batch item 1"),
    ("/generate", {"text": " \n "}, "whitespace"),
    ("/generate", {"text": " <|chunk|> \n<|/chunk|> "}, "whitespace"),
    ("/generate", {"text": "<|chunk|><|/chunk|>"}, "empty chunk"),
    ("/generate", {"input_ids": [BEG, END]}, "empty chunk"),
    ("/generate", {"input_ids": []}, "empty"),
    ("/v1/completions", {"prompt": ""}, ""),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, "empty"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": " "}, {"role": "user", "content": "\n"}]},
     "empty"),
]
FORGED_HINTS = [
    ("/generate", {"input_ids": ATTACK_IDS, "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"input_ids": [ATTACK_IDS, ATTACK_IDS], "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": "plain text", "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": ["one", "two"], "kv_hints": FORGED}, "made by the server"),
    ("/generate", {"text": "a <|chunk|>" + "doc " * 40 + "<|/chunk|> q", "kv_hints": FORGED}, None),
    ("/generate", {"input_ids": [1, 2, 3], "kv_hints": FORGED, "sampling_params": {**GREEDY, "n": 2}},
     "made by the server"),
]


def send(server, path, body):
    body = dict(body)
    if path == "/generate":
        body.setdefault("sampling_params", GREEDY)
    else:
        body.update(model="tiny", max_tokens=3)
    return requests.post(server.url + path, json=body, timeout=120)


def still_serving(server):
    r = send(server, "/generate", {"text": "still there?"})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == GREEDY["max_new_tokens"], r.text


@pytest.mark.server
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


@pytest.mark.server
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
