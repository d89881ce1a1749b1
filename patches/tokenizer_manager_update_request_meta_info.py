"""`meta_info` carries each `mepic_*` figure as a number, not as a one-element list."""

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_request_meta_info"
HOOK_TYPE = HookType.AROUND


def hook(original, manager, meta_info, *args, **kwargs):
    result = original(manager, meta_info, *args, **kwargs)
    for key, value in list(meta_info.items()):
        if key.startswith("mepic_") and isinstance(value, list):
            if value:
                meta_info[key] = value[-1]
            else:
                del meta_info[key]
    return result
