"""Helpers and fixtures shared by test modules (which never import one another), moved out of
tests/hardening/test_intake.py."""

import requests

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END


GREEDY = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}


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
