"""A logit_bias beside a grammar gets an answer the grammar allows, or a 400; never a 500
(sglang_mepic/hardening/scheduler_fields.py, `_bound_logit_bias`).

A client-input battery found `"regex": "[a-z]+", "logit_bias": {"5": 1e308}` a 500 "Grammar accept_token
failed": SGLang adds the bias after the grammar's mask as a float32 row, 1e308 is inf there, -inf + inf is NaN,
and the sampler picks the NaN token (greedy's argmax) or token 0 (a softmax row all NaN), which the grammar
forbids. The same on every route and with a JSON schema; without a grammar such a bias answered token 0, or a
500 from the sampler. Each bias is now clamped into OpenAI's [-100, 100] (the grammar wins over any finite bias),
and a NaN bias is a 400. After each, the server serves the next request normally.
"""

import json
import re

import pytest
import requests

from support.intake import still_serving

BANG, IST = 5, 619  # the tiny model's "!" (no letter: the regex forbids it) and "ist" (letters: it allows it)
REGEX = "[a-z]+"
SCHEMA = {"enum": ["alpha", "beta"]}  # every answer it allows is checkable: a prefix of "alpha" or "beta" quoted
ALLOWED_JSON = ('"alpha"', '"beta"')


def post(server, path, body, greedy=True):
    body = {"temperature": 0, **body} if greedy else body
    if path == "/generate":
        payload = {"text": "hello", "sampling_params": {"max_new_tokens": 8, **body}}
    elif path == "/v1/chat/completions":
        payload = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **body}
    else:
        payload = {"model": "tiny", "prompt": "hello", "max_tokens": 8, **body}
    return requests.post(server.url + path, json=payload, timeout=120)


def text_of(path, r):
    data = r.json()
    if path == "/generate":
        return data["text"]
    choice = data["choices"][0]
    return choice["message"]["content"] if path == "/v1/chat/completions" else choice["text"]


def obeys(grammar, text):
    if grammar == "regex":
        return re.fullmatch("[a-z]*", text) is not None  # 8 tokens of [a-z]+ cut anywhere: letters only
    return any(allowed.startswith(text) for allowed in ALLOWED_JSON)


def grammar_field(path, grammar):
    if grammar == "regex":
        return {"regex": REGEX}
    if path == "/v1/chat/completions":
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": SCHEMA}}}
    return {"json_schema": json.dumps(SCHEMA)}


ROUTES = ["/v1/completions", "/v1/chat/completions", "/generate"]
# The OpenAI routes' models read a bias as a float, so "inf" and "-inf" arrive as infinities: the same as 1e308
BIASES = [{str(BANG): 1e308}, {str(BANG): -1e308}, {str(BANG): 100}, {str(BANG): 1e38},
          {str(BANG): 1e308, str(IST): -1e308}, {str(BANG): 1e308, "1": 1e308}]
OPENAI_ONLY = [{str(BANG): "inf"}, {str(BANG): "-inf"}, {str(BANG): "Infinity", str(IST): "-Infinity"}]


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("grammar", ["regex", "json_schema"])
def test_the_battery_request(tiny_server, path, grammar):
    """The request as the battery sent it: the route's default temperature (sampled: token 0 won), a 500."""
    r = post(tiny_server, path, {**grammar_field(path, grammar), "logit_bias": {str(BANG): 1e308}}, greedy=False)
    assert r.status_code == 200, r.text
    assert obeys(grammar, text_of(path, r)), r.text
    still_serving(tiny_server)


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("grammar", ["regex", "json_schema"])
@pytest.mark.parametrize("bias", BIASES + OPENAI_ONLY, ids=json.dumps)
def test_a_bias_never_beats_the_grammar(tiny_server, path, grammar, bias):
    if path == "/generate" and bias in OPENAI_ONLY:
        pytest.skip("/generate reads a bias as a JSON number: a string is SGLang's own 400")
    r = post(tiny_server, path, {**grammar_field(path, grammar), "logit_bias": bias})
    assert r.status_code == 200, r.text  # every one of these is a number a clamp can honour
    text = text_of(path, r)
    assert obeys(grammar, text), f"{text!r} is not what the {grammar} allows"
    still_serving(tiny_server)


@pytest.mark.parametrize("path", ROUTES)
def test_a_huge_bias_on_an_allowed_token_forces_it(tiny_server, path):
    """Clamped to 100, a bias of 1e308 still does what it asks: every token is the biased one the grammar
    allows (the clamp must not cost what an infinite bias on an allowed token already got)."""
    r = post(tiny_server, path, {"regex": REGEX, "logit_bias": {str(IST): 1e308}})
    assert r.status_code == 200, r.text
    assert text_of(path, r) == "ist" * 8


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "top_p": 0.9}], ids=json.dumps)
def test_without_a_grammar_a_huge_bias_forces_its_token(tiny_server, path, sampling):
    """Infinite biases made the row's softmax NaN: greedy answered token 0 ("<|begin_of_text|>") rather than a
    biased token, and top_p sampling was a 500 (torch.multinomial refused the NaN probabilities)."""
    r = post(tiny_server, path, {**sampling, "logit_bias": {str(IST): 1e308, str(BANG): 1e308}})
    assert r.status_code == 200, r.text
    assert re.fullmatch("(ist|!)+", text_of(path, r)), r.text
    still_serving(tiny_server)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("bias", [{str(BANG): "nan"}, {str(IST): "NaN"}], ids=json.dumps)
@pytest.mark.parametrize("grammar", [None, "regex"])
def test_a_nan_bias_is_a_400(tiny_server, path, bias, grammar):
    """A NaN bias means nothing a sampler can honour. JSON has no NaN (SGLang's parsers refuse the literal, a
    400), but the OpenAI models read the string "nan" as one: it answered token 0, or a 500 beside a grammar."""
    body = {"logit_bias": bias, **(grammar_field(path, grammar) if grammar else {})}
    r = post(tiny_server, path, body)
    assert r.status_code == 400, r.text
    assert "logit_bias" in r.text and "NaN" in r.text, r.text
    still_serving(tiny_server)
