"""Strip chunk markup before SGLang tokenizes a generate request (sglang_mepic.frontend.ids_and_hint.prepare)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import ids_and_hint

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import (
        EmbeddingReqInput,
        GenerateReqInput,
        TokenizedEmbeddingReqInput,
        TokenizedGenerateReqInput,
    )
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._tokenize_one_request"
HOOK_TYPE = HookType.AROUND


async def hook(original: Callable[..., Any], manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput,
               *args: Any, **kwargs: Any) -> TokenizedGenerateReqInput | TokenizedEmbeddingReqInput:
    ids_and_hint.prepare(manager, obj)
    return await original(manager, obj, *args, **kwargs)
