"""Chat messages may carry chunk markup, the separator, or auto-chunked contents (sglang_mepic.frontend.chat_markup)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import chat_markup

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages"
HOOK_TYPE = HookType.AROUND


def hook(original, serving, request, *args, **kwargs):
    return chat_markup.process(original, serving, request, *args, **kwargs)
