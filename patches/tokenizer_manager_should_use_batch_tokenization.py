"""Keep marked-up batches off SGLang's batch tokenizer, which would tokenize the
markers as text; the per-request path strips them instead (sglang_mepic.request_markup)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.markup import any_text_markup

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._should_use_batch_tokenization"
HOOK_TYPE = HookType.AROUND


def hook(original, manager, batch_size, obj, *args, **kwargs):
    return not any_text_markup(getattr(obj, "text", None)) and original(manager, batch_size, obj, *args, **kwargs)
