"""Wrong types in a client's request are the client's error (400), not the server's (500).

SGLang's request parsing assumes shapes it does not check: its OpenAI request
models have `mode="before"` validators that call `.get` on whatever was sent
(`response_format: true`, a JSON string as the whole body), and
`GenerateReqInput.normalize_batch_and_arguments` indexes `sampling_params`
(`[]`). Those raise AttributeError, TypeError or IndexError, which the HTTP
server answers with a 500 and a bare "Internal Server Error". The request
fuzzer (tests/hardening/e2e/test_request_fuzz.py) found them.

Two checks, both at the edge: OpenAI bodies are validated against SGLang's own
request model before FastAPI parses them (a validator that crashes means the
body was malformed), and normalization errors of those types become ValueErrors,
which SGLang answers with a 400.

And one in front of every route (issue 85.6): a JSON body nested deeper than
MAX_JSON_DEPTH is a 400 that says so. The stdlib parser raises RecursionError
near depth 1,000, which is no ValueError: `[` * 5000 + `]` * 5000 was a 500 on
`/remove_external_corpus` and the OpenAI routes (our own checks parse those
bodies with `json.loads`), while SGLang's orjson answered other routes with a
"JSON decode error" at depth 1,024. Every body of every route passes through the
ASGI middleware stack, so the check is one middleware there (JsonDepthMiddleware),
for every path and method, whatever the route does with the body; only form
bodies (multipart, urlencoded), which no route reads as JSON, pass unread.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import numbers
import os
import re
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Callable, cast

if TYPE_CHECKING:
    from fastapi.responses import ORJSONResponse
    from starlette.requests import Request
    from starlette.types import ASGIApp, ExceptionHandler, Message, Receive, Scope, Send

    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput

OPENAI = "sglang.srt.entrypoints.openai.protocol"
ANTHROPIC = "sglang.srt.entrypoints.anthropic.protocol"
# Routes whose body FastAPI parses into one of SGLang's request models: (module, model).
MODELS = {
    "/v1/completions": (OPENAI, "CompletionRequest"),
    "/v1/chat/completions": (OPENAI, "ChatCompletionRequest"),
    "/invocations": (OPENAI, "ChatCompletionRequest"),  # SageMaker's route to the same handler
    "/v1/embeddings": (OPENAI, "EmbeddingRequest"),
    # a tool's `type` that is no string crashed the tools discriminator (a 500)
    "/v1/messages": (ANTHROPIC, "AnthropicMessagesRequest"),
    "/v1/messages/count_tokens": (ANTHROPIC, "AnthropicCountTokensRequest"),
}
SHAPE_ERRORS = (AttributeError, TypeError, IndexError, KeyError)
# SGLang's normalization also asserts shapes (`/v1/classify` with a list rid: "The rid should be a list.")
NORMALIZE_ERRORS = (*SHAPE_ERRORS, AssertionError)
# The most samples of one prompt (`n`), OpenAI's own bound for chat completions.
MAX_SAMPLES = 128
# The deepest nesting of arrays and objects a JSON body may have (`{"a": [1]}` is 2 deep). A request's own
# structure needs a few levels (a batch of token lists: 3; a tool's JSON schema: a dozen or two); the stdlib
# parser fails near 1,000 (fewer, the deeper the stack it is called from) and orjson at 1,024.
MAX_JSON_DEPTH = 128


def normalize(original: Callable[..., Any], obj: GenerateReqInput | EmbeddingReqInput, *args: Any,
              **kwargs: Any) -> None:
    """`GenerateReqInput.normalize_batch_and_arguments`, its shape errors made ValueErrors."""
    params = getattr(obj, "sampling_params", None)
    for one in [params] if isinstance(params, dict) else params if isinstance(params, list) else []:
        if isinstance(one, dict) and "n" in one:
            _check_samples(one["n"])  # before SGLang copies the prompts n times (n = 2**31 ran out of memory)
    try:
        result = original(obj, *args, **kwargs)
    except NORMALIZE_ERRORS as e:
        raise ValueError(f"malformed request: {type(e).__name__}: {e}") from None
    if getattr(obj, "is_single", False) and obj.rid is not None and not isinstance(obj.rid, str):
        # a list of rids on one prompt reached SGLang's request table as a key (a 500)
        raise ValueError(f"rid of a single request must be a string, not {type(obj.rid).__name__}")
    _check_token_lists(getattr(obj, "input_ids", None), single=getattr(obj, "is_single", True))
    _check_texts(getattr(obj, "text", None), single=getattr(obj, "is_single", True))
    _check_items_split(obj)
    _check_samples(getattr(obj, "parallel_sample_num", 1))
    return result


def _check_samples(n: object) -> None:
    """SGLang splits a batch into n copies per prompt; n = 0 indexed an empty list (a 500), and
    n = 10**6 queued a million copies, which kept the server from answering anyone for minutes."""
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
        raise ValueError(f"n (samples per prompt) must be a whole number from 1 to {MAX_SAMPLES}, not {n!r}")


def _check_items_split(obj: GenerateReqInput | EmbeddingReqInput) -> None:
    """A batch is split into one request per item later, outside any request's error handling: a per-item
    field shorter than the batch (`"text": [""], "audio_data": []`) raised IndexError there (a 500). Split
    it now, as SGLang will, and forget the split items (SGLang caches them; the request may still change)."""
    if getattr(obj, "is_single", True) or not isinstance(getattr(obj, "rid", None), list):
        return
    samples = getattr(obj, "parallel_sample_num", 1)
    items = getattr(obj, "batch_size", 0) * (samples if isinstance(samples, int) and samples > 0 else 1)
    try:
        # a batch's rid shorter than the batch (`"rid": []`) too; a list, as checked above
        for i in range(max(len(cast("list[str]", obj.rid)), items)):
            obj[i]
    except SHAPE_ERRORS as e:
        raise ValueError(f"malformed batch: a per-item field does not have one entry per prompt "
                         f"({type(e).__name__}: {e})") from None
    finally:
        obj.__dict__.pop("_sub_obj_cache", None)


def _check_texts(text: object, single: bool) -> None:
    """`text` is a string (a list of strings for a batch): a list inside a batch (a /vertex_generate
    instance's list `text`) was tokenized into a list of lists, which the scheduler's array refused (a 500)."""
    if text is None or single:
        return  # SGLang types a single text itself
    for i, item in enumerate(text if isinstance(text, list) else []):
        if not isinstance(item, str):
            raise ValueError(f"text[{i}] must be a string, not {type(item).__name__}")


def _is_token(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_token_lists(input_ids: object, single: bool) -> None:
    """`input_ids` is a list of whole numbers (a list of such lists for a batch): a string among them
    reached the markup scan and the scheduler's tensors as it was (a 500 through /vertex_generate)."""
    if input_ids is None:
        return
    rows = [input_ids] if single else input_ids
    if not isinstance(rows, list):
        raise ValueError(f"input_ids must be a list of token ids, not {type(input_ids).__name__}")
    for i, row in enumerate(rows):
        where = "input_ids" if single else f"input_ids[{i}]"
        if not isinstance(row, list):
            raise ValueError(f"{where} must be a list of token ids, not {type(row).__name__}")
        for bad in (t for t in row if not _is_token(t)):
            raise ValueError(f"{where} must hold whole-number token ids, found {bad!r} ({type(bad).__name__})")


def install() -> None:
    """Put the body check in front of SGLang's HTTP app (once), before the app starts, and answer a
    ValueError that escapes any route's handler as `/generate` answers one: a 400 with its message.

    SGLang's `/generate` and OpenAI handlers catch the ValueErrors their request checks raise; other
    routes let them escape (`/separate_reasoning` with an unknown parser, found by the request
    fuzzer), and Starlette answered those with a bare 500."""
    from sglang.srt.entrypoints.http_server import app

    if not any(m.cls is RequestShapeMiddleware for m in app.user_middleware):
        app.add_middleware(RequestShapeMiddleware)
    if not any(m.cls is JsonDepthMiddleware for m in app.user_middleware):
        app.add_middleware(JsonDepthMiddleware)  # added last, so in front of the shape check: it parses no deep body
    if ValueError not in app.exception_handlers:
        # Starlette calls a handler with the class it is registered for; its type says any Exception
        app.add_exception_handler(ValueError, cast("ExceptionHandler", _refused))


async def _refused(request: Request, error: ValueError) -> ORJSONResponse:
    from fastapi.responses import ORJSONResponse

    return ORJSONResponse({"error": {"message": str(error) or type(error).__name__}}, status_code=400)


def vertex_route() -> str:
    """SGLang serves Vertex AI's predict route where AIP_PREDICT_ROUTE says, as its app does."""
    return os.environ.get("AIP_PREDICT_ROUTE", "/vertex_generate")


def _vertex_error(data: object) -> str | None:
    """SGLang builds a GenerateReqInput from the `parameters` given: a key it does not know was a
    TypeError in its handler (a 500)."""
    params = data.get("parameters") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        return None
    from sglang.srt.managers.io_struct import GenerateReqInput

    unknown = sorted(set(params) - {f.name for f in dataclasses.fields(GenerateReqInput)})
    if unknown:
        return f"unknown parameters: {', '.join(map(repr, unknown[:8]))} (Vertex parameters are /generate's fields)"
    return None


def checked(path: str | None) -> bool:
    return path in MODELS or path == vertex_route()


def shape_error(path: str, body: bytes) -> str | None:
    """Why a body crashes the request model's validation; None if it validates or fails cleanly."""
    if not checked(path):
        return None
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None  # FastAPI answers malformed JSON itself (too deep: JsonDepthMiddleware, in front of this one)
    if path not in MODELS:
        return _vertex_error(data)
    module, name = MODELS[path]
    try:
        getattr(importlib.import_module(module), name).model_validate(data)
    except SHAPE_ERRORS as e:
        return f"malformed request body: {type(e).__name__}: {e}"
    except Exception:  # noqa: BLE001 - a clean validation error: FastAPI reports it as usual
        return None
    return None


class RequestShapeMiddleware:
    """Pure ASGI, so a body it reads is handed on unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or not checked(scope.get("path")):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        why = shape_error(scope["path"], body)
        if why is None:
            return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}], receive),
                                  send)
        await _answer_400(send, _error_body(scope["path"], why))


# A JSON string, escapes included (in UTF-8 no byte of a longer character is `"` or a backslash)
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = [0] * 256
_STEP[ord("[")] = _STEP[ord("{")] = 1
_STEP[ord("]")] = _STEP[ord("}")] = -1
# Content types whose bodies no route parses as JSON (FastAPI reads them as forms)
FORM_TYPES = (b"multipart/", b"application/x-www-form-urlencoded")


def json_depth(body: bytes) -> int:
    """How deep the arrays and objects of a JSON body nest, brackets inside strings not counted (a body that
    is not JSON gets the depth of its brackets outside quotes). Linear, and in C but for one step per bracket:
    a 30 MB batch of token lists takes about 65 ms."""
    if b'"' in body:
        body = _JSON_STRING.sub(b"", body)
    return max(accumulate(map(_STEP.__getitem__, body.translate(None, _NOT_BRACKETS))), default=0)


def depth_error(body: bytes) -> str | None:
    """Why this body is refused for its nesting; None if it is not too deep."""
    if body.count(b"[") + body.count(b"{") <= MAX_JSON_DEPTH:
        return None  # no deeper than its brackets: nearly every body, passed without a scan
    depth = json_depth(body)
    if depth <= MAX_JSON_DEPTH:
        return None
    return (f"the JSON body is nested {depth} levels deep; at most {MAX_JSON_DEPTH} levels of arrays and "
            f"objects are accepted")


def _error_body(path: str, why: str) -> bytes:
    """The route's error envelope: Anthropic's on its routes (what its SDKs parse, as SGLang answers there),
    OpenAI's elsewhere (what SGLang answers a request it cannot validate with, on every route)."""
    if MODELS.get(path, ("",))[0] == ANTHROPIC:
        return json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": why}}).encode()
    return json.dumps({"object": "error", "message": why, "type": "BadRequestError", "param": None,
                       "code": 400}).encode()


async def _answer_400(send: Send, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": 400,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def _reads_as_json(scope: Scope) -> bool:
    """Whether a route could parse this request's body as JSON: any but a form (SGLang's routes that call
    `request.json()` themselves parse whatever content type was sent, or none)."""
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            return not value.lower().lstrip().startswith(FORM_TYPES)
    return True


class JsonDepthMiddleware:
    """Pure ASGI, in front of every route: each request's body is read whole (as every JSON route reads it),
    checked and handed on unchanged, then the client's own messages (a disconnect among them)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _reads_as_json(scope):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before its body ended: SGLang sees it leave
                return await self.app(scope, _replay([message], receive), send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        why = depth_error(body) if body else None
        if why is None:
            return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}],
                                                 receive), send)
        await _answer_400(send, _error_body(scope.get("path", ""), why))


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """The messages already read, then the client's own: SGLang listens on `receive` for the
    client leaving (to abort its request), so later calls must reach the real connection."""
    pending = list(messages)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
