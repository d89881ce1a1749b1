"""Non-streamed chat completions carry the MEPIC figures in `metadata["mepic"]` (see sglang_mepic.frontend.openai_report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import openai_report

if TYPE_CHECKING:
    from fastapi.responses import ORJSONResponse
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, ChatCompletionResponse
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], serving: OpenAIServingChat, request: ChatCompletionRequest,
         ret: list[dict[str, Any]], *args: Any, **kwargs: Any) -> ChatCompletionResponse | ORJSONResponse:
    return openai_report.attach(original(serving, request, ret, *args, **kwargs), ret, getattr(request, "n", 1) or 1)
