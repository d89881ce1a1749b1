"""Non-streamed completions carry the MEPIC figures in `metadata["mepic"]` (see
sglang_mepic.frontend.openai_meta), and echo the prompt without chunk markers (sglang_mepic.frontend.echo)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import echo, openai_meta

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_completions.OpenAIServingCompletion._build_completion_response"
HOOK_TYPE = HookType.AROUND


def hook(original, serving, request, ret, *args, **kwargs):
    response = original(serving, echo.without_markers(request), ret, *args, **kwargs)
    return openai_meta.attach(response, ret, getattr(request, "n", 1) or 1)
