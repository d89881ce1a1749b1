"""Keep batches with markup or the separator off SGLang's batch tokenizer, which would tokenize
them as text; the per-request path splits them instead (sglang_mepic.frontend.ids_and_hint)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend.auto_chunk import any_may_split

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._should_use_batch_tokenization"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], manager: TokenizerManager, batch_size: int,
         obj: GenerateReqInput | EmbeddingReqInput, *args: Any, **kwargs: Any) -> bool:
    return not any_may_split(getattr(obj, "text", None)) and original(manager, batch_size, obj, *args, **kwargs)
