"""`meta_info` carries each `mepic_*` figure as a number, streamed or not.

The scheduler sends them as request-level customized info, which the tokenizer
side hands on as one-element lists (and, when streaming, repeats on every chunk
after the first). Every response a request yields passes through here.

`mepic_residency` lists where each chunk segment of the request was when its
compile looked it up: device, host, storage (the file tier) or absent.

A request that did no chunk work (no chunk longer than a page, `full` mode, a
server without the mepic cache) gets every figure too (openai_meta.complete),
so `/generate` and the OpenAI responses' `metadata.mepic` say the same. Internal
compile requests are left as they are: their own figures say where the chunk
was found.
"""

from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import openai_meta
from sglang_mepic.patches import tokenizer_manager_tokenize_one_request as compile_patch

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._stream_one_response"
HOOK_TYPE = HookType.AROUND


def scalars(meta_info: dict) -> None:
    for key, value in list(meta_info.items()):
        if key.startswith("mepic_") and isinstance(value, list):
            if value:
                meta_info[key] = value[-1]
            else:
                del meta_info[key]


async def hook(original, manager, obj, *args, **kwargs):
    found = None
    client = isinstance(obj, GenerateReqInput) and not getattr(obj, compile_patch.COMPILE_FLAG, False)
    async for out in original(manager, obj, *args, **kwargs):
        if isinstance(out, dict) and isinstance(out.get("meta_info"), dict):
            meta = out["meta_info"]
            scalars(meta)
            # The compiles ran before the request was admitted; their answers may trail its first output.
            if found is None:
                found = await compile_patch.residency(obj)
            if found is not None:
                meta["mepic_residency"] = found
            if client:
                openai_meta.complete(meta)
        yield out
