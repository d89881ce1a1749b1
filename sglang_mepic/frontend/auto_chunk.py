"""Chunks without hand-written markup (opt-in): a separator string, and chat auto-chunking.

Both are turned into exactly the `<|chunk|>` ... `<|/chunk|>` markup a user would
have written, before anything is tokenized, so a request is laid out, compiled,
reused and reported (`meta_info["mepic_chunks"]`) as its marked-up form is.

**Separator** (`--mepic-separator STR`; LMCache's CacheBlend calls it
`blend_special_str`, `" # # "` by default there). As in CacheBlend's prompts
(`sys_prompt SEP chunk SEP ... SEP question`):

- the piece before the first separator is the instruction and the piece after
  the last one the question: prompt text, either may be empty;
- every piece between two separators is a chunk;

so `A SEP B SEP C SEP D` is `A<|chunk|>B<|/chunk|><|chunk|>C<|/chunk|>D`. Text
without the separator is plain text. Refused with a 400: a single separator (no
piece lies between two), an empty or blank piece between two, and a separator in
a request that also holds markup text (`<|chunk|>`, `<|/chunk|>`), whether or not
`--mepic-text-markup` is on: the two could not be told apart. It applies to
`/generate` text, `/v1/completions` prompts and chat message contents; in chat,
each message content (or text part) splits on its own, so a chunk never spans
messages, as markup cannot either. Token-id prompts are not searched for it.

**Auto-chunking** (`--mepic-auto-chunk`, chat requests only). A chat text is a
message's string content, or one `text` part of a content-part list (parts are
tokenized separately, so a chunk cannot span two). It becomes a chunk when it is
at least `MIN_PAGES` pages long, counted in the tokens it has as a chunk (the
text tokenized alone, without special tokens), and:

- `messages`: it belongs to any message but the last user turn (the question);
- `tools`: it is the content of a `tool` message (a tool result), or a `text`
  part followed by another text part in the same message: documents passed as
  content parts come first and the message's own words last, so the last text
  part is never a document. Image, audio and video parts are never chunks.

A chunk shorter than two pages would save nothing (its first page is computed
in the request's context anyway) and cost a compile. Past `--mepic-max-chunks`,
the first ones are taken: a growing conversation keeps the layout of its
earlier turns, so their prefix still matches. A request that holds markup text
or uses the separator is left to them: auto-chunking only adds chunks to
requests that mark none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Hashable, Sequence, TypeVar, Union, cast

from sglang_mepic import env
from sglang_mepic.frontend import known_texts
from sglang_mepic.frontend.markup import CHUNK_CLOSE, CHUNK_OPEN, MarkupError, has_text_markup, split_text
from sglang_mepic.wire.layout import Kind

if TYPE_CHECKING:
    from sglang.srt.entrypoints.ollama.protocol import OllamaMessage
    from sglang.srt.entrypoints.openai.protocol import (ChatCompletionMessageContentPart,
                                                        ChatCompletionMessageContentTextPart,
                                                        ChatCompletionMessageParam)

MIN_PAGES = 2

Parts = list[tuple[Kind, str]]
# A chat message: an OpenAI request's (`/v1/chat/completions`) or an Ollama one's (`/api/chat`, ollama_routes.py).
Message = TypeVar("Message", bound=Union["ChatCompletionMessageParam", "OllamaMessage"])


def split_separated(text: str, separator: str) -> Parts:
    """Split text on the separator: instruction, chunks, question (as split_text returns markup's pieces)."""
    parts = text.split(separator)
    if len(parts) == 1:
        return [(Kind.PROMPT, text)] if text else []
    if len(parts) == 2:
        raise MarkupError(f"separator {separator!r} occurs once: chunks are the pieces between two separators "
                          f"(instruction{separator}chunk{separator}...{separator}question)")
    at = len(parts[0])
    for i, part in enumerate(parts[1:-1], start=1):
        if not part.strip():
            raise MarkupError(f"separator {separator!r}: chunk {i}, after the separator at character {at}, is "
                              "empty or blank")
        at += len(separator) + len(part)
    pieces = [(Kind.PROMPT, parts[0]), *((Kind.CHUNK, p) for p in parts[1:-1]), (Kind.PROMPT, parts[-1])]
    return [(kind, part) for kind, part in pieces if part or kind is Kind.CHUNK]


def as_markup(pieces: Parts) -> str:
    """The marked-up text a user would have written for these pieces."""
    return "".join(CHUNK_OPEN + part + CHUNK_CLOSE if kind is Kind.CHUNK else part for kind, part in pieces)


def _separated(text: str, separator: str | None) -> bool:
    if separator is None or separator not in text:
        return False
    if has_text_markup(text):
        raise MarkupError(f"the text uses both the separator {separator!r} and chunk markup ({CHUNK_OPEN}, "
                          f"{CHUNK_CLOSE}); mark chunks one way")
    return True


def parse_separator(text: str) -> str:
    """The string that splits text requests into chunks; kept exactly, spaces included."""
    if not text.strip():
        raise ValueError(f"--mepic-separator {text!r}: give a string with a visible character "
                         "(LMCache's CacheBlend uses ' # # ')")
    if CHUNK_OPEN in text or CHUNK_CLOSE in text:
        raise ValueError(f"--mepic-separator {text!r} holds chunk markup ({CHUNK_OPEN} or {CHUNK_CLOSE}); "
                         "choose a string that markup cannot be confused with")
    return text


def active_separator() -> str | None:
    """`--mepic-separator`, checked; None: no separator."""
    value = env.settings().separator
    return None if value is None else parse_separator(value)


def text_pieces(text: str) -> Parts | None:
    """How a text prompt splits into pieces by what its client wrote: its markup, or the separator;
    None: by neither (ids_and_hint.py then looks for registered texts)."""
    separator = active_separator()
    if _separated(text, separator):
        return split_separated(text, cast(str, separator))  # _separated: not None
    if env.settings().text_markup and has_text_markup(text):
        return split_text(text)
    return None


def may_split(text: object) -> bool:
    """Whether a text prompt may be split into pieces (and so must be tokenized a piece at a time)."""
    separator = active_separator()
    return isinstance(text, str) and ((separator is not None and separator in text) or has_text_markup(text)
                                      or env.settings().known_texts)


def any_may_split(texts: object) -> bool:
    """Whether any prompt of a batch (a list of texts) may be split into pieces."""
    return isinstance(texts, list) and any(may_split(t) for t in texts)


@dataclass(frozen=True)
class ChatText:
    """One text of a chat request: a message's string content, or one text part of it."""

    message: int
    part: int | None  # None: the content is a string
    text: str

    @property
    def where(self) -> str:
        return f"messages[{self.message}].content" + ("" if self.part is None else f"[{self.part}]")


def chat_texts(messages: Sequence[Message]) -> list[ChatText]:
    out = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, str):
            out.append(ChatText(i, None, content))
        elif isinstance(content, list):
            out += [ChatText(i, j, cast("ChatCompletionMessageContentTextPart", part).text)
                    for j, part in enumerate(content)
                    if getattr(part, "type", None) == "text" and isinstance(getattr(part, "text", None), str)]
    return out


def _last_user_turn(messages: Sequence[Message]) -> int | None:
    return max((i for i, m in enumerate(messages) if m.role == "user"), default=None)


def candidates(messages: Sequence[Message], mode: str) -> list[ChatText]:
    """The texts that become chunks under `mode` when they are long enough (the module's rules)."""
    texts = chat_texts(messages)
    if mode == "messages":
        last = _last_user_turn(messages)
        return [t for t in texts if t.message != last]
    if mode == "tools":
        last_part = {t.message: t.part for t in texts}  # each message's last text part
        return [t for t in texts
                if messages[t.message].role == "tool" or (t.part is not None and t.part != last_part[t.message])]
    return []


def _with_texts(messages: Sequence[Message], replaced: dict[tuple[int, int | None], str]) -> list[Message]:
    """Copies of the messages with some texts replaced; the client's objects are left as sent."""
    out = list(messages)
    for (i, j), text in replaced.items():
        message = out[i]
        if j is None:
            out[i] = cast(Message, message.model_copy(update={"content": text}))  # a copy: its own class
        else:
            parts = list(cast("list[ChatCompletionMessageContentPart]", message.content))  # a part: a list
            parts[j] = parts[j].model_copy(update={"text": text})
            out[i] = cast(Message, message.model_copy(update={"content": parts}))
    return out


def separated(messages: Sequence[Message]) -> bool:
    """Whether any chat text holds the separator."""
    separator = active_separator()
    return separator is not None and any(separator in t.text for t in chat_texts(messages))


def chat_messages(messages: Sequence[Message], count_tokens: Callable[[str], int], page_size: int,
                  namespace: Hashable = None, max_chars: int | None = None) -> list[Message] | None:
    """The chat messages with the server's markup in them (separator, auto-chunking or registered
    texts), or None to render them as sent. `count_tokens`: a text's token count as a chunk;
    `max_chars`: the most characters a prompt that fits the context has (longer texts are not searched)."""
    texts = chat_texts(messages)
    separator = active_separator()
    separated = [t for t in texts if separator is not None and separator in t.text]
    typed = [t for t in texts if has_text_markup(t.text)]
    if separated and typed:
        raise MarkupError(f"{separated[0].where} uses the separator {separator!r} and {typed[0].where} holds chunk "
                          f"markup ({CHUNK_OPEN}, {CHUNK_CLOSE}); mark chunks one way")
    if separated:
        replaced = {}
        for t in separated:
            try:
                replaced[t.message, t.part] = as_markup(split_separated(t.text, cast(str, separator)))  # found in it
            except MarkupError as e:
                raise MarkupError(f"{t.where}: {e} (character positions count from the start of that "
                                  "content)") from None
        return _with_texts(messages, replaced)
    if typed:
        return None
    settings = env.settings()
    replaced, left = {}, settings.max_chunks
    mode = settings.chat_chunking
    if mode != "off":
        long = [t for t in candidates(messages, mode) if t.text.strip() and count_tokens(t.text) >= MIN_PAGES * page_size]
        for t in long[:left]:
            replaced[t.message, t.part] = CHUNK_OPEN + t.text + CHUNK_CLOSE
        left -= len(replaced)
    # Registered texts inside the contents auto-chunking left whole.
    for t in texts:
        if left <= 0 or (t.message, t.part) in replaced:
            continue
        pieces = known_texts.known_pieces(t.text, namespace, max_chars)
        if pieces is not None:
            kept, chunks = [], 0
            for kind, part in pieces:  # past the request's limit, a found text stays prompt text
                chunk = kind is Kind.CHUNK and chunks < left
                chunks += chunk
                kept.append((Kind.CHUNK if chunk else Kind.PROMPT, part))
            replaced[t.message, t.part] = as_markup(kept)
            left -= chunks
    return _with_texts(messages, replaced) if replaced else None
