"""`/api/generate` answers a request the intake refuses with a 400, not a 500 (ollama_routes.py)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import ollama_routes

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate"
HOOK_TYPE = HookType.AROUND


async def hook(original, serving, request, *args, **kwargs):
    return await ollama_routes.handle(original, serving, request, *args, **kwargs)
