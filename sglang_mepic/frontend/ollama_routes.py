"""Tokenizer side: the Ollama-compatible routes (`/api/generate`, `/api/chat`) take the
intake `/generate` and `/v1/chat/completions` take, and refuse with a 400 in Ollama's
error shape instead of a 500.

SGLang's Ollama handlers call the tokenizer manager directly and catch nothing, so
a request the intake refuses (malformed chunk markup, markers around nothing, any
ValueError SGLang answers with a 400 on `/generate`) ended as `500 Internal Server
Error`; a streamed one as a 200 whose stream broke off. The first event of a
stream is awaited before the response starts, so a refusal is a 400 there too.

`/api/generate` reads chunk markup in its prompt as `/generate` does. `/api/chat`
renders its messages as `/v1/chat/completions` does (chat_markup.process): markup
in a message content marks chunks, is checked message by message (an error names
`messages[i].content`), and the separator and auto-chunking apply; SGLang's own
handler tokenized the rendered template whole, so the markers were text to the
model and malformed or blank chunks were served. A chat whose messages are all
empty or whitespace is refused, as on `/v1/chat/completions`, instead of being
answered with up to 2,048 generated tokens (Ollama's default here; over 120 s).
"""

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, TypeVar, cast

from fastapi.responses import ORJSONResponse, StreamingResponse

from sglang_mepic import env
from sglang_mepic.frontend import auto_chunk, chat_markup

if TYPE_CHECKING:  # quoted where used (no `from __future__ import annotations`: a module of FastAPI handlers)
    from fastapi import Request
    from sglang.srt.entrypoints.ollama.protocol import OllamaChatRequest, OllamaChatResponse, OllamaGenerateRequest
    from sglang.srt.entrypoints.ollama.serving import OllamaServing
    from starlette.responses import Content

T = TypeVar("T")


def _refusal(error: Exception) -> ORJSONResponse:
    return ORJSONResponse({"error": str(error)}, status_code=HTTPStatus.BAD_REQUEST)


async def _checked_stream(response: StreamingResponse) -> StreamingResponse | ORJSONResponse:
    """The stream with its first event already produced: a refusal surfaces before any byte is sent."""
    events = cast("AsyncIterator[Content]", response.body_iterator)  # SGLang's streams are async generators
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        return response
    except (ValueError, TypeError) as e:  # a refusal, or options of the wrong type
        return _refusal(e)

    async def replay() -> AsyncIterator["Content"]:
        yield first
        async for event in events:
            yield event

    return StreamingResponse(replay(), media_type=response.media_type, status_code=response.status_code,
                             headers={k: v for k, v in response.headers.items() if k.lower() != "content-length"})


async def _answered(answer: Awaitable[T]) -> T | StreamingResponse | ORJSONResponse:
    """An Ollama handler's awaitable answer, a refusal made a 400."""
    try:
        response = await answer
    except (ValueError, TypeError) as e:  # a refusal, or options of the wrong type
        return _refusal(e)
    return await _checked_stream(response) if isinstance(response, StreamingResponse) else response


async def handle(original: Callable[..., Awaitable[T]], serving: "OllamaServing",
                 request: "OllamaGenerateRequest | OllamaChatRequest", *args: Any,
                 **kwargs: Any) -> T | StreamingResponse | ORJSONResponse:
    return await _answered(original(serving, request, *args, **kwargs))


class _Rendered:
    """What `chat_markup.process` takes from SGLang's `_process_messages`: the prompt ids."""

    prompt_ids: str | list[int]  # chat_markup.Rendered

    def __init__(self, ids: list[int]) -> None:
        self.prompt_ids = self.plain_ids = ids


def _render(serving: "OllamaServing", request: "OllamaChatRequest", *args: Any, **kwargs: Any) -> _Rendered:
    """The prompt ids of the messages, rendered as SGLang's `OllamaServing.handle_chat` renders them."""
    messages = [{"role": m.role, "content": m.content} for m in request.messages]
    return _Rendered(serving.tokenizer_manager.tokenizer.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def _plain(request: "OllamaChatRequest") -> bool:
    """Nothing for the markup path to do: no markup or separator in any content, no auto-chunking."""
    return env.settings().chat_chunking == "off" and not any(auto_chunk.may_split(t.text)
                                                    for t in auto_chunk.chat_texts(request.messages))


async def handle_chat(original: Callable[..., Awaitable["OllamaChatResponse | StreamingResponse"]],
                      serving: "OllamaServing", request: "OllamaChatRequest", raw_request: "Request", *args: Any,
                      **kwargs: Any) -> "OllamaChatResponse | StreamingResponse | ORJSONResponse":
    """`/api/chat`: SGLang's handler, with the prompt `/v1/chat/completions` builds from the messages."""
    try:
        if _plain(request):
            chat_markup.check_content(request)
            return await handle(original, serving, request, raw_request, *args, **kwargs)
        prompt = chat_markup.process(_render, serving, request)
    except (ValueError, TypeError) as e:  # a refusal, or options of the wrong type
        return _refusal(e)
    if prompt.prompt_ids is prompt.plain_ids:  # markup left as text (--mepic-text-markup off)
        return await handle(original, serving, request, raw_request, *args, **kwargs)
    from sglang.srt.managers.io_struct import GenerateReqInput

    marked = GenerateReqInput(input_ids=cast("list[int]", prompt.prompt_ids),  # _render's ids, or mark_rendered's
                              stream=request.stream,
                              # SGLang's own `options: dict = None` takes None (its default)
                              sampling_params=serving._convert_options_to_sampling_params(
                                  cast("dict[str, Any]", request.options)))
    respond: Callable[..., Awaitable[OllamaChatResponse | StreamingResponse]]
    respond = serving._stream_chat_response if request.stream else serving._generate_chat_response
    return await _answered(respond(marked, raw_request, serving.tokenizer_manager.served_model_name))
