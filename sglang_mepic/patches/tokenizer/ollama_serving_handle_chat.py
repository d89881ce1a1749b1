"""`/api/chat` takes the intake of `/v1/chat/completions` (chunk markup in message contents, the
separator, auto-chunking, no chat with nothing to say) and answers a refusal with a 400, not a 500
(ollama_routes.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import ollama_routes

if TYPE_CHECKING:
    from fastapi.responses import ORJSONResponse, StreamingResponse
    from sglang.srt.entrypoints.ollama.protocol import OllamaChatRequest, OllamaChatResponse
    from sglang.srt.entrypoints.ollama.serving import OllamaServing

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat"
HOOK_TYPE = HookType.AROUND


async def hook(original: Callable[..., Any], serving: OllamaServing, request: OllamaChatRequest, *args: Any,
               **kwargs: Any) -> OllamaChatResponse | StreamingResponse | ORJSONResponse:
    return await ollama_routes.handle_chat(original, serving, request, *args, **kwargs)
