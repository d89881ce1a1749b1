"""A request FastAPI cannot validate is answered without the server's source file and line.

SGLang answers a RequestValidationError (a body that is not JSON, a `curl -d` without
`content-type: application/json`, a field of the wrong type) with a 400 whose message is
`str(exc)`. FastAPI 0.165's `ValidationException.__str__` ends with the endpoint's context,
`File "/.../sglang/srt/entrypoints/http_server.py", line 933, in generate_request`: where the
server is installed, for any client to read. The handler is given the same errors without that
context (the route's path, which the client sent, stays); the server's log keeps nothing less.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Callable, cast

from fastapi.exceptions import RequestValidationError

if TYPE_CHECKING:
    from fastapi.exceptions import EndpointContext
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.types import ExceptionHandler


def without_source(exc: RequestValidationError) -> RequestValidationError:
    """The error with its endpoint's file, line and function left out."""
    context: EndpointContext | None = {"path": exc.endpoint_path} if exc.endpoint_path else None
    return RequestValidationError(exc.errors(), body=exc.body, endpoint_ctx=context)


def install() -> None:
    """Wrap SGLang's handler of validation errors (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app

    # SGLang's handler, registered for this class: an async one over HTTP requests
    original = cast("Callable[[Request, RequestValidationError], Awaitable[Response]] | None",
                    app.exception_handlers.get(RequestValidationError))
    if original is None or getattr(original, "mepic_wrapped", False):
        return

    async def handler(request: Request, exc: RequestValidationError) -> Response:
        return await original(request, without_source(exc))

    # why: a marker on the function itself, read back by getattr above; mypy models no function attributes
    handler.mepic_wrapped = True  # type: ignore[attr-defined]
    app.add_exception_handler(RequestValidationError, cast("ExceptionHandler", handler))  # called with its class only
