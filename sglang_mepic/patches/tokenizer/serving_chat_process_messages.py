"""Chat messages may carry chunk markup, the separator, or auto-chunked contents (sglang_mepic.frontend.chat_markup)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import chat_markup

if TYPE_CHECKING:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, MessageProcessingResult
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], serving: OpenAIServingChat, request: ChatCompletionRequest, *args: Any,
         **kwargs: Any) -> MessageProcessingResult:
    return chat_markup.process(original, serving, request, *args, **kwargs)
