"""Non-streamed completions carry the MEPIC figures in `metadata["mepic"]` (see
sglang_mepic.frontend.openai_report), and echo the prompt without chunk markers (sglang_mepic.frontend.echo)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import echo, openai_report

if TYPE_CHECKING:
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest, CompletionResponse
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], serving: OpenAIServingCompletion, request: CompletionRequest,
         ret: list[dict[str, Any]], *args: Any, **kwargs: Any) -> CompletionResponse:
    response = original(serving, echo.without_markers(request), ret, *args, **kwargs)
    return openai_report.attach(response, ret, getattr(request, "n", 1) or 1)
