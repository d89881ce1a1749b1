"""Non-streamed chat completions carry the MEPIC figures in `metadata["mepic"]` (see sglang_mepic.frontend.openai_meta)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import openai_meta

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._build_chat_response"
HOOK_TYPE = HookType.AROUND


def hook(original, serving, request, ret, *args, **kwargs):
    return openai_meta.attach(original(serving, request, ret, *args, **kwargs), ret, getattr(request, "n", 1) or 1)
