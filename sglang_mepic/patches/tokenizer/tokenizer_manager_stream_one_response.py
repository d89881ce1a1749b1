"""`meta_info` carries each `mepic_*` figure as a number, streamed or not (sglang_mepic.frontend.response_report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import response_report

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._stream_one_response"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput,
         *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
    return response_report.stream(original, manager, obj, *args, **kwargs)  # an async generator, as the original
