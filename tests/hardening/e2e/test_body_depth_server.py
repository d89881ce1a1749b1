"""JSON nested deeper than a sane bound is a 400 that says so on every route of a real server (issue 85.6;
sglang_mepic/hardening/body_types.py, its JsonDepthMiddleware). `[` * 5000 + `]` * 5000 was a 500 on
`/remove_external_corpus` and the OpenAI and Anthropic routes (the stdlib parser's RecursionError), and a bare
"JSON decode error" on the routes SGLang parses with orjson; the request fuzzer draws such bodies too."""

import json
import re

import pytest
import requests

MAX_JSON_DEPTH = 128  # the server's bound (body_types.MAX_JSON_DEPTH), as a client reads it in the 400
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def deep(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "1" + "}" * depth
    return json.dumps({"text": "hi", "messages": []})[:-1] + ', "x": ' + deep(depth - 1, "list") + "}"  # one field


BODIES = [(5000, "list"), (5000, "object"), (5000, "field"), (MAX_JSON_DEPTH + 1, "list")]


def post(server, method: str, path: str, body: str) -> requests.Response:
    return requests.request(method, server.url + path, data=body.encode(), timeout=60,
                            headers={"content-type": "application/json"})


def refused_for_depth(r: requests.Response, depth: int) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    said = body.get("message") if isinstance(body, dict) else None
    said = said or (error.get("message") if isinstance(error, dict) else error)  # OpenAI's envelope or Anthropic's
    return r.status_code == 400 and f"nested {depth} levels deep" in str(said)


# The routes that answered these bodies with a 500, and one of each kind that SGLang parses itself
@pytest.mark.parametrize("depth, kind", BODIES, ids=[f"{k}-{d}" for d, k in BODIES])
@pytest.mark.parametrize("path", ["/remove_external_corpus", "/v1/completions", "/v1/chat/completions",
                                  "/v1/embeddings", "/v1/messages", "/invocations", "/vertex_generate", "/generate",
                                  "/api/chat", "/add_external_corpus", "/update_weights_from_disk"])
def test_deep_json_is_a_400_that_says_so(tiny_server, path, depth, kind):
    r = post(tiny_server, "POST", path, deep(depth, kind))
    assert refused_for_depth(r, depth), (r.status_code, r.text[:300])


def routes(server) -> list[tuple[str, str]]:
    """(method, path) of every route that takes a body: those the live server lists and those SGLang's app
    registers without listing them, path parameters filled in."""
    from sglang.srt.entrypoints.http_server import app

    found = {(m.upper(), p) for p, ops in requests.get(server.url + "/openapi.json", timeout=30).json()["paths"].items()
             for m in ops if m.upper() in WRITES}
    found |= {(m, r.path) for r in app.routes if hasattr(r, "methods") and r.methods for m in r.methods if m in WRITES}
    return sorted((m, re.sub(r"\{[^}]+\}", "x", p)) for m, p in found)


def test_deep_json_is_a_400_on_every_route(tiny_server):
    every = routes(tiny_server)
    assert {("POST", "/generate"), ("POST", "/v1/chat/completions"), ("POST", "/flush_cache"),
            ("POST", "/update_weights_from_disk"), ("POST", "/remove_external_corpus")} <= set(every)
    wrong = []
    for method, path in every:
        for depth, kind in BODIES:
            r = post(tiny_server, method, path, deep(depth, kind))
            # a route SGLang lists without serving it here is answered before any body is read (unserved_routes)
            if not refused_for_depth(r, depth) and not (r.status_code == 404 and " served" in r.text):
                wrong.append(f"{method} {path} {kind}-{depth}: {r.status_code} {r.text[:160]}")
    assert wrong == [], f"{len(wrong)} of {len(every) * len(BODIES)}:\n" + "\n".join(wrong)
    out = requests.post(tiny_server.url + "/generate", timeout=120,
                        json={"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 2


def test_json_at_the_bound_is_served(tiny_server):
    """The bound counts every level, the body's own included; a field SGLang ignores makes the body that deep."""
    body = {"model": "m", "prompt": "Hello", "max_tokens": 2, "temperature": 0}
    at = json.dumps(body)[:-1] + ', "x": ' + deep(MAX_JSON_DEPTH - 1, "list") + "}"
    r = post(tiny_server, "POST", "/v1/completions", at)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text[:300]
    over = json.dumps(body)[:-1] + ', "x": ' + deep(MAX_JSON_DEPTH, "list") + "}"
    assert refused_for_depth(post(tiny_server, "POST", "/v1/completions", over), MAX_JSON_DEPTH + 1)
