"""Every route refuses what `/generate` refuses, with a 4xx that says why (ollama_routes.py,
markup.py, scheduler_fields.check_token_ids).

Each case here was a 500, a hang or an inconsistency: the Ollama routes answered bad
markup with `500 Internal Server Error` (a stream broke off after its 200); `/api/chat`
with an empty message generated up to 2,048 tokens (over 120 s on SmolLM2 on CPU);
chat served a whitespace-only chunk that `/generate` refused; `/v1/detokenize` answered
a negative id with a 500.
"""

import json

import pytest
import requests

WHITESPACE_CHUNK = "<|chunk|>  \n <|/chunk|>"
SHORT = {"num_predict": 2, "temperature": 0}


def post(server, path, body):
    with requests.post(server.url + path, json=body, timeout=120, stream=bool(body.get("stream"))) as r:
        return r.status_code, r.text


def alive(server):
    assert post(server, "/generate", {"text": "still?", "sampling_params": {"max_new_tokens": 1}})[0] == 200


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("prompt, reason", [("Hello <|chunk|>unclosed doc", "never closed"),
                                            (WHITESPACE_CHUNK, "only whitespace"),
                                            ("a <|/chunk|> b", "no matching")])
def test_ollama_generate_refuses_bad_markup(tiny_server, stream, prompt, reason):
    status, text = post(tiny_server, "/api/generate", {"model": "m", "prompt": prompt, "stream": stream,
                                                       "options": SHORT})
    assert status == 400 and reason in json.loads(text)["error"], text
    alive(tiny_server)


@pytest.mark.parametrize("stream", [False, True])
def test_ollama_routes_still_answer(tiny_server, stream):
    status, text = post(tiny_server, "/api/generate", {"model": "m", "prompt": "Read: <|chunk|>" + "word " * 40 +
                                                       "<|/chunk|> ok?", "stream": stream, "options": SHORT})
    assert status == 200, text
    status, text = post(tiny_server, "/api/chat", {"model": "m", "stream": stream, "options": SHORT,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, text


@pytest.mark.timeout(60)
@pytest.mark.parametrize("content", ["", "   ", "\n"])
def test_ollama_chat_with_nothing_to_answer_is_refused_at_once(tiny_server, content):
    status, text = post(tiny_server, "/api/chat", {"model": "m", "messages": [{"role": "user", "content": content}]})
    assert status == 400 and "empty or whitespace" in text, text


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": WHITESPACE_CHUNK, "sampling_params": {"max_new_tokens": 2}}),
    ("/generate", {"text": "Question " + WHITESPACE_CHUNK + " ok?", "sampling_params": {"max_new_tokens": 2}}),
    ("/v1/completions", {"model": "m", "max_tokens": 2, "prompt": "Q " + WHITESPACE_CHUNK}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": WHITESPACE_CHUNK}]}),
    ("/v1/chat/completions", {"model": "m", "max_tokens": 2,
                              "messages": [{"role": "user", "content": "Question " + WHITESPACE_CHUNK + " ok?"}]}),
    ("/api/generate", {"model": "m", "prompt": "Q " + WHITESPACE_CHUNK, "stream": False}),
])
def test_a_whitespace_chunk_is_refused_on_every_path(tiny_server, path, body):
    status, text = post(tiny_server, path, body)
    assert status == 400 and "empty chunk" in text and "only whitespace" in text, text


@pytest.mark.parametrize("tokens", [[-1], [[1, 2], [3, -7]], [10**18]])
def test_detokenize_refuses_a_negative_id(tiny_server, tokens):
    status, text = post(tiny_server, "/v1/detokenize", {"model": "m", "tokens": tokens})
    assert status == 400 and "not a token id" in text, text


def test_a_value_error_escaping_any_route_is_a_400(tiny_server):
    """`/separate_reasoning` with an unknown parser raised a ValueError its handler does not catch."""
    status, text = post(tiny_server, "/separate_reasoning", {"text": "<|chunk|>", "reasoning_parser": "m"})
    assert status == 400 and "Unsupported model type" in text, text
    alive(tiny_server)


@pytest.mark.parametrize("method, route", [("get", "/dump_expert_distribution_record"),
                                           ("post", "/start_expert_distribution_record"),
                                           ("post", "/stop_expert_distribution_record")])
def test_expert_distribution_routes_need_their_flag(tiny_server, method, route):
    """Without --expert-distribution-recorder-mode the scheduler's handler raised and the server died."""
    r = requests.request(method, tiny_server.url + route, timeout=60)
    assert r.status_code == 404 and "--expert-distribution-recorder-mode" in r.text, r.text
    alive(tiny_server)
