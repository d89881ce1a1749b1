"""Strip chunk markup before SGLang tokenizes a generate request (sglang_mepic.frontend.request_markup.prepare)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import request_markup

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request"
HOOK_TYPE = HookType.AROUND


async def hook(original, manager, obj, *args, **kwargs):
    request_markup.prepare(manager, obj)
    return await original(manager, obj, *args, **kwargs)
