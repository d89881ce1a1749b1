"""`/v1/detokenize` refuses a negative token id with a 400 (the tokenizer raised, which SGLang
answered with a 500; limits.check_token_ids)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import limits

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.openai.serving_tokenize.OpenAIServingDetokenize._handle_non_streaming_request"
HOOK_TYPE = HookType.AROUND


async def hook(original, serving, adapted_request, request, *args, **kwargs):
    try:
        limits.check_token_ids(request.tokens)
    except limits.LimitError as e:
        return serving.create_error_response(str(e))
    return await original(serving, adapted_request, request, *args, **kwargs)
