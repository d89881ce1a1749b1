"""Tokenizer side: every response's `meta_info` carries each `mepic_*` figure as a number.

The scheduler sends them as one report (wire/report.py) in request-level
customized info, which the tokenizer side hands on as a one-element list (and,
when streaming, repeats on every chunk after the first). Every response a
request yields passes through `stream`, which turns the report into the figures.

`mepic_chunks` lists the request's chunks as `[start, end)` token spans of its
prompt (real tokens, as `prompt_tokens` counts them), however they were marked:
markup, the separator or auto-chunking (auto_chunk.py).

`mepic_residency` lists where each chunk segment of the request was when the
scheduler planned it: device, host, storage (the file tier) or absent (then a
compile row computed it in the request's own batch, compile_rows.py).

A request that did no chunk work (no chunk longer than a page, `full` mode, a
server without the mepic cache) gets every figure too (openai_report.complete),
so `/generate` and the OpenAI responses' `metadata.mepic` say the same.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_mepic.frontend import openai_report, state
from sglang_mepic.wire import report

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager


def unpack(meta_info: dict[str, Any]) -> None:
    """The report's figures in place of the report (its newest, when a stream has repeated it)."""
    sent = meta_info.pop(report.KEY, None)
    got = report.Report.from_wire(sent[-1] if isinstance(sent, list) and sent else sent)
    if got is not None:
        meta_info.update(got.meta_info())


async def stream(original: Callable[..., AsyncIterator[Any]], manager: TokenizerManager,
                 obj: GenerateReqInput | EmbeddingReqInput, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
    """SGLang's `_stream_one_response`, with the figures in each response's meta_info."""
    client = isinstance(obj, GenerateReqInput)
    async for out in original(manager, obj, *args, **kwargs):
        if isinstance(out, dict) and isinstance(out.get("meta_info"), dict):
            meta = out["meta_info"]
            unpack(meta)
            if client:
                meta[report.CHUNKS] = state.chunk_spans(obj)
                openai_report.complete(meta)
        yield out
