"""`/v1/detokenize` refuses a negative token id with a 400 (the tokenizer raised, which SGLang
answered with a 500; scheduler_fields.check_token_ids)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening import scheduler_fields

if TYPE_CHECKING:
    from fastapi.responses import ORJSONResponse

    from sglang.srt.entrypoints.openai.protocol import DetokenizeRequest, DetokenizeResponse, ErrorResponse
    from sglang.srt.entrypoints.openai.serving_tokenize import OpenAIServingDetokenize

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._handle_non_streaming_request"
HOOK_TYPE = HookType.AROUND


async def hook(original: Callable[..., Any], serving: OpenAIServingDetokenize, adapted_request: DetokenizeRequest,
               request: DetokenizeRequest, *args: Any,
               **kwargs: Any) -> DetokenizeResponse | ErrorResponse | ORJSONResponse:
    try:
        scheduler_fields.check_token_ids(request.tokens)
    except scheduler_fields.FieldError as e:
        return serving.create_error_response(str(e))
    return await original(serving, adapted_request, request, *args, **kwargs)
