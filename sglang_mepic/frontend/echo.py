"""What `/v1/completions` echoes with `echo: true`: the prompt the model saw.

SGLang echoes `request.prompt` as the client sent it (text as it is, token ids
decoded). Markers never reach the model, so they must not reach the output
either: they are removed here, as the tokenizer hook removes them before the
model. Pads are slots of the KV row, not text, so there is nothing of them to
remove. With `--mepic-text-markup off` typed markers are text the model saw, and
stay; id markers always mark (they are not token ids), so they always go. The
separator (`--mepic-separator`, auto_chunk.py) never reaches the model either.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union, cast

from sglang_mepic import env
from sglang_mepic.frontend import auto_chunk
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, CHUNK_CLOSE, CHUNK_END_ID, CHUNK_OPEN, has_text_markup

if TYPE_CHECKING:
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest

MARKER_IDS = (CHUNK_BEGIN_ID, CHUNK_END_ID)
# A completion request's prompt (`CompletionRequest.prompt`): text, ids, or a list of either.
Prompt = Union[str, list[str], list[int], list[list[int]]]


def _text(text: str) -> str:
    separator = auto_chunk.active_separator()
    if separator is not None and separator in text:
        # Text that also held markup was refused (400), so every separator split the prompt.
        return text.replace(separator, "")
    if not (env.settings().text_markup and has_text_markup(text)):
        return text
    # Malformed markup was refused (400) before generation, so plain removal is exactly split_text's.
    return text.replace(CHUNK_OPEN, "").replace(CHUNK_CLOSE, "")


def _ids(ids: list[int]) -> list[int]:
    return [t for t in ids if t not in MARKER_IDS]


def unmarked(prompt: Prompt) -> Prompt:
    """The prompt of a completion request (text, ids, or a list of either) without chunk markers."""
    if isinstance(prompt, str):
        return _text(prompt)
    if isinstance(prompt, list) and prompt:
        if isinstance(prompt[0], str):
            return [_text(p) for p in cast(list[str], prompt)]
        if isinstance(prompt[0], list):
            return [_ids(p) for p in cast(list[list[int]], prompt)]
        return _ids(cast(list[int], prompt))
    return prompt


def without_markers(request: CompletionRequest) -> CompletionRequest:
    """The request as its echo should see it; the request itself is left alone (its prompt was sent)."""
    if not getattr(request, "echo", False):
        return request
    prompt = unmarked(request.prompt)
    return request if prompt == request.prompt else request.model_copy(update={"prompt": prompt})
