"""JSON nested deeper than a sane bound is a 400 on every route (issue 85.6; sglang_mepic/hardening/body_types.py).
The unit half: the depth count and the middleware on a stand-in app; the server's every route is in
e2e/test_body_depth_server.py."""

import asyncio
import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from sglang_mepic.hardening import admin_bodies, body_types
from sglang_mepic.hardening.body_types import MAX_JSON_DEPTH, JsonDepthMiddleware, depth_error, json_depth


def nested(depth: int, kind: str = "list") -> str:
    if kind == "list":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


@pytest.mark.parametrize("body, depth", [
    ("{}", 1), ("[]", 1), ('{"a": [1, {"b": [2]}]}', 4), ('"[[[["', 0), ('{"t": "[\\"[[["}', 1),
    ('["\\\\", [[]]]', 3), ('{"text": "{{{{", "ids": [[1], [2]]}', 3), ("5", 0), ("", 0),
    (json.dumps({"text": "日本語 [{"}), 1), (nested(5000), 5000), (nested(300, "object"), 300),
])
def test_the_depth_counts_arrays_and_objects_outside_strings(body, depth):
    assert json_depth(body.encode()) == depth


def test_the_bound_is_inclusive_and_brackets_in_strings_do_not_count():
    assert MAX_JSON_DEPTH == 128  # as e2e/test_body_depth_server.py states it, a client reading the 400
    assert depth_error(nested(MAX_JSON_DEPTH).encode()) is None
    assert depth_error(json.dumps({"text": "[" * 10_000}).encode()) is None
    assert depth_error(json.dumps({"input_ids": [[5] * 8] * 5000}).encode()) is None  # many brackets, depth 2
    why = depth_error(nested(MAX_JSON_DEPTH + 1, "object").encode())
    assert why is not None and f"nested {MAX_JSON_DEPTH + 1} levels deep" in why and str(MAX_JSON_DEPTH) in why


async def echo(request: Request) -> JSONResponse:
    """A route that parses its body with the stdlib, as SGLang's own routes and MEPIC's checks did."""
    body = await request.body()
    return JSONResponse({"parsed": type(json.loads(body)).__name__ if body else None, "length": len(body)})


def app_with(*middleware) -> Starlette:
    app = Starlette(routes=[Route("/echo", echo, methods=["POST", "PUT", "GET"]),
                            Route("/remove_external_corpus", echo, methods=["POST"])])
    for cls in middleware:
        app.add_middleware(cls)  # Starlette puts the last added in front, as on SGLang's app
    return app


def call(app, path: str, pieces: list[bytes], method: str = "POST", content_type: str | None = "application/json",
         then: dict | None = None) -> tuple[int, bytes, list[dict]]:
    """One request through the ASGI app, its body in `pieces`, then `then` (a disconnect) or nothing more:
    (status, body, what the route was handed by `receive`)."""
    last = len(pieces) - (0 if then else 1)  # a client that leaves leaves before its body ends
    incoming = [{"type": "http.request", "body": p, "more_body": i < last} for i, p in enumerate(pieces)]
    incoming += [then] if then else []
    sent: list[dict] = []

    async def run() -> None:
        async def receive() -> dict:
            if incoming:
                return incoming.pop(0)
            await asyncio.sleep(3600)  # the client sends nothing more
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            sent.append(message)

        headers = [(b"content-type", content_type.encode())] if content_type else []
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "", "query_string": b"",
                 "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80)}
        try:
            await app(scope, receive, send)
        except Exception:  # noqa: BLE001 - Starlette's error middleware answered 500, then raised it again
            pass

    asyncio.run(run())
    starts = [m for m in sent if m["type"] == "http.response.start"]
    return (starts[0]["status"] if starts else 0,
            b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"), incoming)


def message(body: bytes) -> str:
    return json.loads(body)["message"]


def test_without_the_check_a_deep_body_is_a_500():
    assert call(app_with(), "/echo", [nested(5000).encode()])[0] == 500


@pytest.mark.parametrize("method", ["POST", "PUT", "GET"])
@pytest.mark.parametrize("content_type", ["application/json", "text/plain", None])
@pytest.mark.parametrize("kind", ["list", "object"])
def test_a_deep_body_is_a_400_that_says_so_whatever_its_method_and_type(method, content_type, kind):
    status, body, _ = call(app_with(JsonDepthMiddleware), "/echo", [nested(5000, kind).encode()], method,
                           content_type)
    assert status == 400 and "nested 5000 levels deep" in message(body), body


def test_a_body_within_the_bound_reaches_the_route_unchanged_in_any_number_of_pieces():
    body = json.dumps({"a": json.loads(nested(MAX_JSON_DEPTH - 1)), "text": "[" * 500}).encode()
    status, answer, _ = call(app_with(JsonDepthMiddleware), "/echo", [body[:100], body[100:101], body[101:]])
    assert status == 200 and json.loads(answer) == {"parsed": "dict", "length": len(body)}


def test_a_client_that_leaves_mid_body_is_seen_leaving_by_the_route():
    seen = []

    async def route(scope, receive, send):
        seen.append(await receive())

    call(JsonDepthMiddleware(route), "/echo", [b"[1,"], then={"type": "http.disconnect"})
    assert seen == [{"type": "http.disconnect"}]


def test_a_form_body_is_not_read_as_json():
    status, _, _ = call(app_with(JsonDepthMiddleware), "/echo", [b"[" * 5000],
                        content_type="multipart/form-data; boundary=x")
    assert status == 500  # the stand-in route parses it anyway: the check left it alone


def test_the_checks_that_parse_a_body_leave_one_too_deep_to_parse_to_the_depth_check():
    """A body too deep for the stdlib parser raised RecursionError in admin_bodies (a 500 on
    /remove_external_corpus) and in body_types' shape check (the OpenAI and Anthropic routes)."""
    assert admin_bodies.body_error("/remove_external_corpus", nested(5000).encode()) is None
    assert body_types.shape_error("/v1/chat/completions", nested(5000).encode()) is None


def test_the_depth_check_stands_in_front_of_the_checks_that_parse_bodies(monkeypatch):
    """On SGLang's app, installed in the hook's order (body_types first): a deep list on
    /remove_external_corpus is refused for its depth, not for being a list."""
    from sglang.srt.entrypoints import http_server

    app = app_with()
    monkeypatch.setattr(http_server, "app", app)
    body_types.install()
    admin_bodies.install()
    order = [m.cls for m in app.user_middleware]
    assert order.index(JsonDepthMiddleware) < order.index(admin_bodies.AdminBodyMiddleware)
    assert order.index(JsonDepthMiddleware) < order.index(body_types.RequestShapeMiddleware)
    status, body, _ = call(app, "/remove_external_corpus", [nested(MAX_JSON_DEPTH + 1).encode()])
    assert status == 400 and f"nested {MAX_JSON_DEPTH + 1} levels deep" in message(body), body
