"""Streamed completions echo the prompt without chunk markers, as non-streamed ones do (sglang_mepic.frontend.echo)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import echo

if TYPE_CHECKING:
    from sglang.srt.entrypoints.openai.protocol import CompletionRequest
    from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._get_echo_text"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], serving: OpenAIServingCompletion, request: CompletionRequest, *args: Any,
         **kwargs: Any) -> str:
    return original(serving, echo.without_markers(request), *args, **kwargs)
