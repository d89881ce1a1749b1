"""`meta_info` carries each `mepic_*` figure as a number, streamed or not.

The scheduler sends them as request-level customized info, which the tokenizer
side hands on as one-element lists (and, when streaming, repeats on every chunk
after the first). Every response a request yields passes through here.
"""

from sglang.srt.plugins.hook_registry import HookType

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


async def hook(original, manager, *args, **kwargs):
    async for out in original(manager, *args, **kwargs):
        if isinstance(out, dict) and isinstance(out.get("meta_info"), dict):
            scalars(out["meta_info"])
        yield out
