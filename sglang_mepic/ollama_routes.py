"""Tokenizer side: the Ollama-compatible routes (`/api/generate`, `/api/chat`) refuse what
`/generate` refuses, with a 400 in Ollama's error shape, instead of a 500.

SGLang's Ollama handlers call the tokenizer manager directly and catch nothing, so
a request the intake refuses (malformed chunk markup, markers around nothing, any
ValueError SGLang answers with a 400 on `/generate`) ended as `500 Internal Server
Error`; a streamed one as a 200 whose stream broke off. The first event of a
stream is awaited before the response starts, so a refusal is a 400 there too.

`/api/generate` reads chunk markup in its prompt as `/generate` does. `/api/chat`
tokenizes its messages with the chat template itself, so markup in a message is
plain text there (as on `/v1/tokenize`); a chat whose messages are all empty or
whitespace is refused, as on `/v1/chat/completions` (chat_markup.py), instead of
being answered with up to 2,048 generated tokens.
"""

from http import HTTPStatus

from fastapi.responses import ORJSONResponse, StreamingResponse


def _refusal(error: Exception) -> ORJSONResponse:
    return ORJSONResponse({"error": str(error)}, status_code=HTTPStatus.BAD_REQUEST)


async def _checked_stream(response: StreamingResponse):
    """The stream with its first event already produced: a refusal surfaces before any byte is sent."""
    events = response.body_iterator
    try:
        first = await events.__anext__()
    except StopAsyncIteration:
        return response
    except ValueError as e:
        return _refusal(e)

    async def replay():
        yield first
        async for event in events:
            yield event

    return StreamingResponse(replay(), media_type=response.media_type, status_code=response.status_code,
                             headers={k: v for k, v in response.headers.items() if k.lower() != "content-length"})


async def handle(original, serving, request, *args, **kwargs):
    try:
        response = await original(serving, request, *args, **kwargs)
    except ValueError as e:
        return _refusal(e)
    return await _checked_stream(response) if isinstance(response, StreamingResponse) else response


async def handle_chat(original, serving, request, *args, **kwargs):
    messages = getattr(request, "messages", None) or []
    if not any(isinstance(m.content, str) and m.content.strip() for m in messages):
        return _refusal(ValueError("every message's content is empty or whitespace: there is no prompt to answer"))
    return await handle(original, serving, request, *args, **kwargs)
