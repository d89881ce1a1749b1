"""Strip chunk markup before SGLang tokenizes a generate request, and send its chunk compiles
first (sglang_mepic.chunk_compiles)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import chunk_compiles

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request"
HOOK_TYPE = HookType.AROUND


async def hook(original, manager, obj, *args, **kwargs):
    await chunk_compiles.prepare(manager, obj)
    return await original(manager, obj, *args, **kwargs)
