"""Put the request-shape check (request_shape.py) in front of SGLang's HTTP app before it starts."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.request_shape import RequestShapeMiddleware

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
HOOK_TYPE = HookType.BEFORE


def hook(*args, **kwargs):
    from sglang.srt.entrypoints.http_server import app

    if not any(m.cls is RequestShapeMiddleware for m in app.user_middleware):
        app.add_middleware(RequestShapeMiddleware)
