"""Keep marked-up batches off SGLang's batch tokenizer, which would tokenize the
markers as text; the per-request path strips them instead."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.markup import has_text_markup

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._should_use_batch_tokenization"
HOOK_TYPE = HookType.AROUND


def hook(original, manager, batch_size, obj, *args, **kwargs):
    texts = getattr(obj, "text", None)
    if isinstance(texts, list) and any(isinstance(t, str) and has_text_markup(t) for t in texts):
        return False
    return original(manager, batch_size, obj, *args, **kwargs)
