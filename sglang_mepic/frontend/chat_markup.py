"""Chat messages may carry chunk markup in their content (OpenAI `/v1/chat/completions`).

SGLang renders the chat template and tokenizes it in one step, which would turn
the markers into text tokens. When the rendered prompt holds markup, re-split it:
each piece is tokenized on its own and the markers become marker ids, which the
tokenizer side then strips like any marked-up input_ids (ids_and_hint.py).

A chat whose messages are all empty is refused (intake.py). Each message's
markup is checked on its own first, so an error names the message
and a character position within it, not within the templated prompt. With
`--mepic-text-markup off` the markers are left as text. The separator and
auto-chunking (auto_chunk.py) put markup into the messages before they are
rendered, so from there on they take this same path. Only the markers the server
put there are read back: where the rendered prompt holds others (a template renders
tool definitions and tool-call arguments too), auto-chunking leaves the request as
sent and the separator is refused (400).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from sglang_mepic import env
from sglang_mepic.frontend import auto_chunk, ids_and_hint, known_texts, limits, state
from sglang_mepic.frontend.intake import IntakeError
from sglang_mepic.frontend.markup import (CHUNK_BEGIN_ID, CHUNK_CLOSE, CHUNK_END_ID, CHUNK_OPEN, MarkupError, has_text_markup,
                                 split_ids, split_text, tokenize_text)
from sglang_mepic.wire.layout import Kind

if TYPE_CHECKING:
    from sglang.srt.entrypoints.ollama.protocol import OllamaChatRequest
    from sglang.srt.entrypoints.ollama.serving import OllamaServing
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from transformers import PreTrainedTokenizerBase


class Rendered(Protocol):
    """What `process` reads of SGLang's processed messages (`MessageProcessingResult`, or ollama_routes' own)."""

    prompt_ids: str | list[int]


# A chat request: OpenAI's (`/v1/chat/completions`) or Ollama's (`/api/chat`, ollama_routes.py); one of either.
ChatRequest = TypeVar("ChatRequest", "ChatCompletionRequest", "OllamaChatRequest")
Result = TypeVar("Result", bound=Rendered)


def _marked(request: ChatCompletionRequest | OllamaChatRequest) -> bool:
    """Whether any message holds markup; malformed markup raises, located in its message."""
    marked = False
    for i, message in enumerate(request.messages):
        content = message.content
        parts = content if isinstance(content, list) else [content]
        for j, part in enumerate(parts):
            text = part if isinstance(part, str) else getattr(part, "text", None)
            if isinstance(text, str) and has_text_markup(text):
                where = f"messages[{i}].content" + (f"[{j}]" if isinstance(content, list) else "")
                try:
                    split_text(text)
                except MarkupError as e:
                    raise MarkupError(f"{where}: {e} (character positions count from the start of that "
                                      f"content; to send the markers as text, start the server with "
                                      f"--mepic-text-markup off)") from None
                marked = True
    return marked


def _has_content(request: ChatCompletionRequest | OllamaChatRequest) -> bool:
    """Whether any message says something: text that is not whitespace, or a non-text part."""
    for message in request.messages:
        content = message.content
        for part in content if isinstance(content, list) else [content]:
            text = part if isinstance(part, str) or part is None else getattr(part, "text", None)
            if part is not None and (not isinstance(text, str) or text.strip()):
                return True
        if getattr(message, "tool_calls", None):
            return True
    return False


def check_content(request: ChatCompletionRequest | OllamaChatRequest) -> None:
    """A chat whose messages say nothing is refused: there is no prompt to answer."""
    if not _has_content(request):
        raise IntakeError("every message's content is empty or whitespace: there is no prompt to answer")


def process(original: Callable[..., Result], serving: OpenAIServingChat | OllamaServing, request: ChatRequest,
            *args: Any, **kwargs: Any) -> Result:
    """SGLang's `_process_messages`, rendering the messages with the markup the server puts in
    them (the separator's or auto-chunking's, auto_chunk.py) and re-split at the markup."""
    manager = serving.tokenizer_manager
    tok = manager.tokenizer
    marked = auto_chunk.chat_messages(request.messages, lambda text: len(tok.encode(text, add_special_tokens=False)),
                                      state.page_size(manager),
                                      known_texts.namespace_of(getattr(request, "extra_key", None),
                                                               getattr(request, "cache_salt", None)),
                                      limits.max_prompt_chars(manager))
    if marked is None:
        return mark_rendered(original(serving, request, *args, **kwargs), request, tok)
    # SGLang's own changes to the request (template kwargs, skip_special_tokens) must stay on it,
    # and the client's messages must come back as sent: swap the messages for the rendering only.
    sent = request.messages
    request.messages = marked
    try:
        result = original(serving, request, *args, **kwargs)
        # The template renders more than the contents (tool definitions, tool-call arguments):
        # markers a client wrote there are not the server's, and must not be read as markup.
        if _markers(_rendered(result, tok)) != sum(_markers(t.text) for t in auto_chunk.chat_texts(marked)):
            if auto_chunk.separated(sent):
                raise MarkupError(f"the request uses the separator {auto_chunk.active_separator()!r} and holds chunk markup "
                                  f"({CHUNK_OPEN}, {CHUNK_CLOSE}) outside its message contents; mark chunks one way")
            request.messages = sent  # auto-chunking adds chunks only to requests that mark none
            return mark_rendered(original(serving, request, *args, **kwargs), request, tok)
        result = mark_rendered(result, request, tok, server_markup=True)
        if auto_chunk.separated(sent) or _fits(manager, request, result.prompt_ids):
            return result
        # The chunks the server chose (auto-chunking, registered texts), padded to whole pages, would take the
        # prompt past the limits its plain form meets: served plain, never a 400 of the server's making.
        request.messages = sent
        return mark_rendered(original(serving, request, *args, **kwargs), request, tok)
    finally:
        request.messages = sent


def _fits(manager: TokenizerManager, request: ChatCompletionRequest | OllamaChatRequest,
          prompt_ids: str | list[int]) -> bool:
    if not isinstance(prompt_ids, list):
        return True
    new = limits.new_tokens(manager, {"max_new_tokens": getattr(request, "max_completion_tokens", None)
                                              or getattr(request, "max_tokens", None)})
    # Each chunk and the prompt before it take less than a page of pads each: most prompts fit by far.
    if limits.fits_laid_out(manager, len(prompt_ids) + 2 * prompt_ids.count(CHUNK_BEGIN_ID) * state.page_size(manager),
                                    new):
        return True
    slots = ids_and_hint.slots_of(manager, split_ids(prompt_ids, manager.model_config.vocab_size))
    return limits.fits_laid_out(manager, slots, new)


def _markers(text: object) -> int:
    return text.count(CHUNK_OPEN) + text.count(CHUNK_CLOSE) if isinstance(text, str) else 0


def _rendered(result: Rendered, tok: PreTrainedTokenizerBase) -> str:
    rendered = result.prompt_ids
    return tok.decode(rendered, skip_special_tokens=False) if isinstance(rendered, list) else rendered


def mark_rendered(result: Result, request: ChatCompletionRequest | OllamaChatRequest, tok: PreTrainedTokenizerBase,
                  server_markup: bool = False) -> Result:
    """SGLang's processed messages (`result`), their prompt ids re-split at the markup; `tok`: the
    tokenizer. `server_markup`: the server put the markup in the messages, so it marks even with
    `--mepic-text-markup off` (auto_chunk.chat_messages left alone any request holding markup text)."""
    check_content(request)
    if not (env.settings().text_markup or server_markup) or not _marked(request):
        return result
    rendered = result.prompt_ids
    if isinstance(rendered, list):
        rendered = tok.decode(rendered, skip_special_tokens=False)
    if not isinstance(rendered, str) or not has_text_markup(rendered):
        return result
    # The template already placed BOS and other special tokens as text.
    pieces = tokenize_text(rendered, lambda s, special: tok.encode(s, add_special_tokens=special),
                           add_special_tokens=False)
    ids: list[int] = []
    for piece in pieces:
        ids += [CHUNK_BEGIN_ID, *piece.tokens, CHUNK_END_ID] if piece.kind is Kind.CHUNK else piece.tokens
    result.prompt_ids = ids
    return result
