"""Chat messages may carry chunk markup in their content (sglang_mepic.chat_markup)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import chat_markup

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages"
HOOK_TYPE = HookType.AFTER


def hook(result, serving, request, *args, **kwargs):
    return chat_markup.mark_rendered(result, request, serving.tokenizer_manager.tokenizer)
