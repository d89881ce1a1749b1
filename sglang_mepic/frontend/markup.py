"""Chunk markup: how clients mark the chunks of a prompt, and how it is removed.

Text (``/generate`` text, ``/v1/completions``, chat message content, frontend
programs through ``sglang_mepic.lang.chunk``)::

    "Answer from the documents. <|chunk|>doc one ...<|/chunk|><|chunk|>doc two ...<|/chunk|> Question: ..."

Token ids (``/generate`` with ``input_ids``): ``CHUNK_BEGIN_ID`` and
``CHUNK_END_ID`` around each chunk's ids. They are negative, so they can never
be real token ids.

Markers never reach the model: each piece of text is tokenized on its own (so a
chunk's tokens do not depend on what surrounds it), the markers are dropped,
and the chunk spans travel to the scheduler as a SGLang ``kv_hints`` action (hint.py).
Malformed markup raises `MarkupError` (a ``ValueError``, which SGLang's HTTP
server turns into a 400 response).
"""

from typing import Callable, Sequence

from sglang_mepic.wire.markers import CHUNK_BEGIN_ID, CHUNK_CLOSE, CHUNK_END_ID, CHUNK_OPEN  # noqa: F401 (markup's own names)
from sglang_mepic.wire.layout import Kind, Piece


class MarkupError(ValueError):
    pass


def has_text_markup(text: str) -> bool:
    return CHUNK_OPEN in text or CHUNK_CLOSE in text


def has_id_markup(ids: Sequence[int]) -> bool:
    return any(i < 0 for i in ids)


def split_text(text: str) -> list[tuple[Kind, str]]:
    """Split marked-up text into (kind, text) pieces; markers are removed."""
    pieces: list[tuple[Kind, str]] = []
    pos = 0
    while pos < len(text):
        open_at = text.find(CHUNK_OPEN, pos)
        close_at = text.find(CHUNK_CLOSE, pos)
        if close_at != -1 and (open_at == -1 or close_at < open_at):
            raise MarkupError(f"chunk markup: {CHUNK_CLOSE} at character {close_at} has no matching {CHUNK_OPEN}")
        if open_at == -1:
            pieces.append((Kind.PROMPT, text[pos:]))
            break
        pieces.append((Kind.PROMPT, text[pos:open_at]))
        start = open_at + len(CHUNK_OPEN)
        nested = text.find(CHUNK_OPEN, start)
        if nested != -1 and (close_at == -1 or nested < close_at):
            raise MarkupError(f"chunk markup: nested {CHUNK_OPEN} at character {nested}; chunks cannot nest")
        if close_at == -1:
            raise MarkupError(f"chunk markup: {CHUNK_OPEN} at character {open_at} is never closed")
        if not text[start:close_at].strip():  # one rule on every path: nothing to reuse, nothing to answer
            raise MarkupError(f"chunk markup: empty chunk at character {open_at}"
                              + (" (only whitespace)" if close_at > start else ""))
        pieces.append((Kind.CHUNK, text[start:close_at]))
        pos = close_at + len(CHUNK_CLOSE)
    return [(k, t) for k, t in pieces if t or k is Kind.CHUNK]


def split_ids(ids: Sequence[int], vocab_size: int) -> list[Piece]:
    """Split marked-up token ids into pieces; validates every id."""
    pieces: list[Piece] = []
    current: list[int] = []
    in_chunk = False
    for i, t in enumerate(ids):
        if t == CHUNK_BEGIN_ID:
            if in_chunk:
                raise MarkupError(f"chunk markup: nested CHUNK_BEGIN_ID ({CHUNK_BEGIN_ID}) at index {i}")
            pieces.append(Piece(Kind.PROMPT, tuple(current)))
            current, in_chunk = [], True
        elif t == CHUNK_END_ID:
            if not in_chunk:
                raise MarkupError(f"chunk markup: CHUNK_END_ID ({CHUNK_END_ID}) at index {i} has no matching begin")
            if not current:
                raise MarkupError(f"chunk markup: empty chunk ending at index {i}")
            pieces.append(Piece(Kind.CHUNK, tuple(current)))
            current, in_chunk = [], False
        elif not 0 <= t < vocab_size:
            raise MarkupError(
                f"input_ids[{i}] = {t} is neither a token id (0..{vocab_size - 1}) nor a chunk marker "
                f"({CHUNK_BEGIN_ID} begins a chunk, {CHUNK_END_ID} ends it)")
        else:
            current.append(t)
    if in_chunk:
        raise MarkupError(f"chunk markup: CHUNK_BEGIN_ID ({CHUNK_BEGIN_ID}) is never closed")
    pieces.append(Piece(Kind.PROMPT, tuple(current)))
    return [p for p in pieces if p.tokens]


def tokenize_text(text: str, encode: Callable[[str, bool], list[int]], add_special_tokens: bool = True) -> list[Piece]:
    """Tokenize each piece of marked-up text on its own; special tokens (BOS) only at the very start."""
    return tokenize_pieces(split_text(text), encode, add_special_tokens)


def tokenize_pieces(parts: Sequence[tuple[Kind, str]], encode: Callable[[str, bool], list[int]],
                    add_special_tokens: bool = True) -> list[Piece]:
    """Tokenize (kind, text) pieces (split_text's, or a separator's) each on its own."""
    pieces = []
    for i, (kind, part) in enumerate(parts):
        tokens = encode(part, add_special_tokens and i == 0)
        if kind is Kind.CHUNK and not tokens:
            raise MarkupError("chunk markup: a chunk tokenizes to no tokens")
        pieces.append(Piece(kind, tuple(tokens)))
    return pieces
