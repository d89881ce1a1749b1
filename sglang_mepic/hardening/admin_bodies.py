"""An admin route that reads its JSON body itself is sent a JSON object, or answered with a 400.

SGLang's `/remove_external_corpus` reads `await request.json()` and calls `.get` on it: a body of
`null`, `[]` or `0` raised AttributeError, which Starlette answered with a bare 500 (the request
fuzzer found it once it fuzzed the admin routes, issue 68). Its siblings parse their bodies into a
request model (`/add_external_corpus`: `**body`, a TypeError it answers with a 400), so only the
routes in OBJECT_BODIES are checked. A body that is not JSON at all is left to SGLang: its
JSONDecodeError is a ValueError, which is a 400 (hardening/body_types.py). A body nested too deep
(`[` * 5000 + `]` * 5000 raised RecursionError here, a 500: issue 85.6) is body_types' depth check's to
answer: it stands in front of this one, and what it lets through parses.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

# route -> the fields its body takes, for the message
OBJECT_BODIES = {"/remove_external_corpus": '{"corpus_id": "..."}'}


def install() -> None:
    """Put the check in front of SGLang's HTTP app (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app
    from starlette.middleware import Middleware

    if not any(m.cls is AdminBodyMiddleware for m in app.user_middleware):
        # behind the other checks (`add_middleware` puts a middleware in front of them): the depth check sees
        # a body before this one parses it, whichever was installed first
        app.user_middleware.append(Middleware(AdminBodyMiddleware))


def body_error(path: str, body: bytes) -> str | None:
    """Why this body cannot be the route's JSON object; None if it is one (or is not JSON, or too deep to parse:
    the depth check's and SGLang's to answer)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if isinstance(data, dict):
        return None
    sent = "null" if data is None else type(data).__name__
    return f"the body must be a JSON object, {OBJECT_BODIES[path]}, not {sent}"


class AdminBodyMiddleware:
    """Pure ASGI: a path lookup per request; the body is read only on the routes it checks."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in OBJECT_BODIES or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left: nothing to answer
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        why = body_error(scope["path"], body)
        if why is None:
            return await self.app(scope, _replayed(body, receive), send)
        payload = json.dumps({"success": False, "message": why}).encode()  # the route's own error shape
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 400, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _replayed(body: bytes, receive: Receive) -> Receive:
    """The body already read, then the client's own messages (a disconnect among them)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
