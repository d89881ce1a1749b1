"""`meta_info` carries each `mepic_*` figure as a number, streamed or not (sglang_mepic.frontend.response_meta)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import response_meta

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._stream_one_response"
HOOK_TYPE = HookType.AROUND


def hook(original, manager, obj, *args, **kwargs):
    return response_meta.stream(original, manager, obj, *args, **kwargs)  # an async generator, as the original
