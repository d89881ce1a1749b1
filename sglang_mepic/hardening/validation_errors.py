"""A request FastAPI cannot validate is answered without the server's source file and line.

SGLang answers a RequestValidationError (a body that is not JSON, a `curl -d` without
`content-type: application/json`, a field of the wrong type) with a 400 whose message is
`str(exc)`. FastAPI 0.165's `ValidationException.__str__` ends with the endpoint's context,
`File "/.../sglang/srt/entrypoints/http_server.py", line 933, in generate_request`: where the
server is installed, for any client to read. The handler is given the same errors without that
context (the route's path, which the client sent, stays); the server's log keeps nothing less.
"""

from fastapi.exceptions import RequestValidationError


def without_source(exc: RequestValidationError) -> RequestValidationError:
    """The error with its endpoint's file, line and function left out."""
    context = {"path": exc.endpoint_path} if exc.endpoint_path else None
    return RequestValidationError(exc.errors(), body=exc.body, endpoint_ctx=context)


def install() -> None:
    """Wrap SGLang's handler of validation errors (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app

    original = app.exception_handlers.get(RequestValidationError)
    if original is None or getattr(original, "mepic_wrapped", False):
        return

    async def handler(request, exc: RequestValidationError):
        return await original(request, without_source(exc))

    handler.mepic_wrapped = True
    app.add_exception_handler(RequestValidationError, handler)
