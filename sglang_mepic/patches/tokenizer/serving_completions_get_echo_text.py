"""Streamed completions echo the prompt without chunk markers, as non-streamed ones do (sglang_mepic.frontend.echo)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import echo

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._get_echo_text"
HOOK_TYPE = HookType.AROUND


def hook(original, serving, request, *args, **kwargs):
    return original(serving, echo.without_markers(request), *args, **kwargs)
