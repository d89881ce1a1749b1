"""`POST /mepic/chunks`: register documents for reuse from unmarked prompts, and warm them.

    curl -s 127.0.0.1:30000/mepic/chunks -H 'content-type: application/json' \
         -d '{"texts": ["<document>", "..."], "cache_salt": "tenant-a"}'

Each text is registered in the request's namespace (`extra_key`, `cache_salt`,
known_texts.py), then, unless `"warm": false`, compiled and stored as a chunk
by one prefill-only request per text, without generating: a RAG pipeline calls
it at indexing time, so the first user does not pay the compile. The answer
says, per text, whether it was new to the namespace and where its chunk was
when asked (`absent`: compiled now; `device`, `host`, `storage`: stored
already), as the request's own `mepic_residency` would; it never says anything
about another namespace's texts. Bad input is a 400 and registers nothing (a
text too long for the context included: it is refused before anything is
registered, and a warm request refused all the same undoes the registration);
texts that do not fit the index beside other namespaces' are a 507 and register
nothing (the index is shared: a full one refuses every namespace's new texts).
Warm requests aborted (`/abort_request`, a server shutting down) leave their
texts registered but not warmed: their `"chunk"` is `"aborted"` and the answer a
503 that says so; registering them again warms them.
"""

from typing import TYPE_CHECKING, cast

from starlette.requests import Request

from sglang_mepic import env
from sglang_mepic.frontend import auto_chunk, limits, ids_and_hint
from sglang_mepic.frontend.markup import has_text_markup
from sglang_mepic.frontend.known_texts import (ANCHOR, IndexFull, KnownTextError, namespace_bytes, namespace_of,
                                               registry, text_bytes)
from sglang_mepic.wire.layout import Kind

if TYPE_CHECKING:  # quoted where used: FastAPI reads `register`'s annotations, which take module-level names only
    from fastapi.responses import JSONResponse
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

ROUTE = "/mepic/chunks"
MAX_TEXTS = 256
FIELDS = {"texts", "extra_key", "cache_salt", "warm"}
# Around the chunk: as a prompt's first piece it would carry the BOS the tokenizer adds to a prompt (it
# must be tokenized as inside any prompt: alone, without special tokens), and a chunk that ends its prompt
# is computed in context (its last token is the one SGLang always computes), never stored.
LEAD, TRAIL = "\n", "\n"


class RouteError(ValueError):
    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index  # the text it is about, if one: the answer's `error.index`


def parse(body: object) -> tuple[list[str], tuple[str | None, str | None], bool]:
    """The texts, the namespace and whether to warm them; RouteError says what is wrong."""
    if not isinstance(body, dict):
        raise RouteError('the body must be a JSON object: {"texts": ["...", ...]}')
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise RouteError(f"unknown field(s) {unknown}; this route takes {sorted(FIELDS)}")
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts:
        raise RouteError('"texts" must be a non-empty list of strings')
    if len(texts) > MAX_TEXTS:
        raise RouteError(f'"texts" holds {len(texts)} texts, more than the {MAX_TEXTS} one request may register; '
                         "send them in several requests")
    limit = env.settings().known_texts_bytes
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise RouteError(f"texts[{i}] is a {type(text).__name__}, not a string", i)
        if len(text.strip()) < ANCHOR:
            raise RouteError(f"texts[{i}] has {len(text.strip())} characters that are not whitespace; a registered "
                             f"text needs at least {ANCHOR} (mark shorter ones with <|chunk|>...<|/chunk|>)", i)
        separator = auto_chunk.active_separator()
        if has_text_markup(text) or (separator is not None and separator in text):
            raise RouteError(f"texts[{i}] holds chunk markup or the separator: register the document's own text", i)
    for name in ("extra_key", "cache_salt"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise RouteError(f'"{name}" must be a string')
    namespace = namespace_of(body.get("extra_key"), body.get("cache_salt"))
    for i, text in enumerate(texts):
        if text_bytes(text) + namespace_bytes(namespace) > limit:
            raise RouteError(f"texts[{i}] takes {text_bytes(text)} bytes of the index, more than the {limit} it "
                             "may hold (--mepic-known-texts-mb)", i)
    warm = body.get("warm", True)
    if not isinstance(warm, bool):
        raise RouteError('"warm" must be true or false')
    return texts, namespace, warm


def check_fits(manager: "TokenizerManager", texts: list[str]) -> None:
    """Refuse, before anything is registered, a text whose warm request the server could not take: it
    could not be found in any prompt that fits the context either."""
    limit = limits.max_prompt_chars(manager)
    for i, text in enumerate(texts):
        if limit is not None and len(text) > limit:
            raise RouteError(f"texts[{i}] has {len(text)} characters, more than the {limit} that can fit the "
                             f"model's context length ({manager.context_len} tokens)", i)
        slots = ids_and_hint.slots_needed(manager, [(Kind.PROMPT, LEAD), (Kind.CHUNK, text), (Kind.PROMPT, TRAIL)])
        if not limits.fits_laid_out(manager, slots, None):
            raise RouteError(f"texts[{i}] needs {slots} KV slots as a chunk, more than the "
                             f"{limits.max_input_slots(manager)} this server accepts in one request (the "
                             "smaller of the context length and the KV pool's input limit)", i)


def _tokenizer_manager() -> "TokenizerManager":
    from sglang.srt.entrypoints.http_server import get_global_state

    # A route is served by a tokenizer manager (a TokenizerWorker under --tokenizer-worker-num), never the router.
    return cast("TokenizerManager", get_global_state().tokenizer_manager)


async def register(request: Request):
    from fastapi.responses import JSONResponse
    from sglang.srt.managers.io_struct import GenerateReqInput

    if not env.settings().known_texts:
        return JSONResponse(status_code=400, content={"error": {
            "message": "registered texts are off on this server: start it with --mepic-auto-chunk known "
                       "(or messages+known, tools+known)", "type": "invalid_request_error"}})
    manager = _tokenizer_manager()
    try:
        try:
            body = await request.json()
        except ValueError:
            raise RouteError("the body is not JSON") from None
        texts, namespace, warm = parse(body)
        check_fits(manager, texts)
        new = registry().add_all(namespace, texts)
    except IndexFull as e:
        return JSONResponse(status_code=507, content={"error": {"message": str(e), "type": "insufficient_storage"}})
    except (RouteError, KnownTextError) as e:
        return _refused(e)
    out = [{"index": i, "registered": "new" if n else "known"} for i, n in enumerate(new)]
    if not warm:
        return JSONResponse(content={"texts": out})
    obj = GenerateReqInput(text=[LEAD + t + TRAIL for t in texts], sampling_params={"max_new_tokens": 0},
                           extra_key=namespace[0], cache_salt=namespace[1])
    try:
        results = await manager.generate_request(obj, request).__anext__()
    except ValueError as e:  # refused after all: a 400 registers nothing
        registry().remove_all(namespace, [t for t, n in zip(texts, new) if n])
        return _refused(RouteError(f"not registered: a warm request was refused: {e}"))
    for entry, result in zip(out, results if isinstance(results, list) else [results]):
        entry["chunk"] = _where(result.get("meta_info", {}))
    aborted = [entry["index"] for entry in out if entry["chunk"] == "aborted"]
    if aborted:
        return JSONResponse(status_code=503, content={"error": {
            "message": f"registered, but the warm requests of texts {aborted} were aborted: their chunks are not "
                       "stored; register them again to warm them", "type": "aborted"}, "texts": out})
    return JSONResponse(content={"texts": out})


def _where(meta_info: dict) -> str:
    """Where a warm request found its text's chunk, as its `mepic_residency` says; an aborted one never got
    as far as the scheduler's plan (or was stopped before its chunk was stored)."""
    if (meta_info.get("finish_reason") or {}).get("type") == "abort":
        return "aborted"
    where = meta_info.get("mepic_residency") or []
    return where[0] if where else "not laid out"


def _refused(e: ValueError) -> "JSONResponse":
    from fastapi.responses import JSONResponse

    error: dict[str, object] = {"message": str(e), "type": "invalid_request_error"}
    if getattr(e, "index", None) is not None:
        error["index"] = cast(RouteError, e).index  # a RouteError's, the one error with an index
    return JSONResponse(status_code=400, content={"error": error})


def install() -> None:
    """Add the route to SGLang's HTTP app (once), before the app starts."""
    from sglang.srt.entrypoints.http_server import app

    if not any(getattr(r, "path", None) == ROUTE for r in app.routes):
        app.add_api_route(ROUTE, register, methods=["POST"])
