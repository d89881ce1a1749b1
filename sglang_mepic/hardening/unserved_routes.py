"""A route SGLang lists but did not start is a 404 that says so, not a 500.

SGLang starts its OpenAI Responses API (`/v1/responses`, `/v1/responses/{id}`,
`/v1/responses/{id}/cancel`) only when its handler can be built, which needs the
`openai_harmony` package; otherwise it logs one warning (hidden on CPU, quiet.py)
and keeps the routes, and every request to them raised AttributeError on the app
state: `500 Internal Server Error`, whatever the body (issue 48.3 found it with
chunk markup). The route is answered here while SGLang's handler is absent;
once it exists, SGLang answers as usual (its handler takes chat messages through
`_process_messages`, so chunk markup gets the `/v1/chat/completions` intake).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.datastructures import State
    from starlette.types import ASGIApp, Receive, Scope, Send

# Route prefix -> the app-state attribute SGLang sets when it serves the route, and what it is.
UNSERVED = {"/v1/responses": ("openai_serving_responses", "the OpenAI Responses API")}


def install() -> None:
    """Put the check in front of SGLang's HTTP app (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app

    if not any(m.cls is UnservedRouteMiddleware for m in app.user_middleware):
        app.add_middleware(UnservedRouteMiddleware)


# Routes whose scheduler handler raises when a server flag is not set: the exception left the
# scheduler process, and one GET /dump_expert_distribution_record took the server down (request fuzzer).
NEEDS_FLAG = {
    route: ("expert_distribution_recorder_mode", "--expert-distribution-recorder-mode")
    for route in ("/start_expert_distribution_record", "/stop_expert_distribution_record",
                  "/dump_expert_distribution_record")
}


def _flag_set(setting: str) -> bool:
    from sglang.srt.runtime_context import get_server_args

    try:
        return getattr(get_server_args(), setting, None) is not None
    except Exception:  # noqa: BLE001 - no global args in this process: leave the route to SGLang
        return True


def unserved(path: str, state: State) -> str | None:
    """Why `path` is not served on an app with this state; None if it is (or is not one of these routes)."""
    for prefix, (attribute, what) in UNSERVED.items():
        if (path == prefix or path.startswith(prefix + "/")) and not hasattr(state, attribute):
            return (f"{prefix} is not served: SGLang could not start {what} on this server (it needs the "
                    f"openai_harmony package; the server log says why at --log-level debug)")
    if path in NEEDS_FLAG and not _flag_set(NEEDS_FLAG[path][0]):
        return f"{path} is served only with {NEEDS_FLAG[path][1]} (this server runs without it)"
    return None


class UnservedRouteMiddleware:
    """Pure ASGI: one prefix comparison per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = scope.get("app")
        why = unserved(scope.get("path", ""), app.state) if scope["type"] == "http" and app is not None else None
        if why is None:
            return await self.app(scope, receive, send)
        payload = json.dumps({"object": "error", "message": why, "type": "NotFoundError", "param": None,
                              "code": 404}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
