"""Tokenizer side: every response's `meta_info` carries each `mepic_*` figure as a number.

The scheduler sends them as request-level customized info, which the tokenizer
side hands on as one-element lists (and, when streaming, repeats on every chunk
after the first). Every response a request yields passes through `stream`.

`mepic_chunks` lists the request's chunks as `[start, end)` token spans of its
prompt (real tokens, as `prompt_tokens` counts them), however they were marked:
markup, the separator or auto-chunking (auto_chunk.py).

`mepic_residency` lists where each chunk segment of the request was when its
compile looked it up: device, host, storage (the file tier) or absent
(chunk_compiles.residency).

A request that did no chunk work (no chunk longer than a page, `full` mode, a
server without the mepic cache) gets every figure too (openai_meta.complete),
so `/generate` and the OpenAI responses' `metadata.mepic` say the same. Internal
compile requests are left as they are: their own figures say where the chunk
was found.
"""

from sglang.srt.managers.io_struct import GenerateReqInput

from sglang_mepic import chunk_compiles, openai_meta, request_markup


def scalars(meta_info: dict) -> None:
    for key, value in list(meta_info.items()):
        if key.startswith("mepic_") and isinstance(value, list):
            if value:
                meta_info[key] = value[-1]
            else:
                del meta_info[key]


async def stream(original, manager, obj, *args, **kwargs):
    """SGLang's `_stream_one_response`, with the figures in each response's meta_info."""
    found = None
    client = isinstance(obj, GenerateReqInput) and not chunk_compiles.is_compile(obj)
    async for out in original(manager, obj, *args, **kwargs):
        if isinstance(out, dict) and isinstance(out.get("meta_info"), dict):
            meta = out["meta_info"]
            scalars(meta)
            # The compiles ran before the request was admitted; their answers may trail its first output.
            if found is None:
                found = await chunk_compiles.residency(obj)
            if found is not None:
                meta["mepic_residency"] = found
            if client:
                meta["mepic_chunks"] = request_markup.chunk_spans(obj)
                openai_meta.complete(meta)
        yield out
