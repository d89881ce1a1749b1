"""Chat messages may carry chunk markup in their content (OpenAI `/v1/chat/completions`).

SGLang renders the chat template and tokenizes it in one step, which would turn
the markers into text tokens. When the rendered prompt holds markup, re-split it:
each piece is tokenized on its own and the markers become marker ids, which the
tokenizer side then strips like any marked-up input_ids (request_markup.py).

A chat whose messages are all empty is refused (intake.py). Each message's
markup is checked on its own first, so an error names the message
and a character position within it, not within the templated prompt. With
`--mepic-text-markup off` the markers are left as text.
"""

from sglang_mepic import config
from sglang_mepic.intake import IntakeError
from sglang_mepic.markup import CHUNK_BEGIN_ID, CHUNK_END_ID, MarkupError, has_text_markup, split_text, tokenize_text
from sglang_mepic.segments import Kind


def _marked(request) -> bool:
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


def _has_content(request) -> bool:
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


def mark_rendered(result, request, tok):
    """SGLang's processed messages (`result`), their prompt ids re-split at the markup; `tok`: the tokenizer."""
    if not _has_content(request):
        raise IntakeError("every message's content is empty or whitespace: there is no prompt to answer")
    if not config.text_markup() or not _marked(request):
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
