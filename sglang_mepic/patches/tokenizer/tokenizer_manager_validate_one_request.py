"""Refuse a request with a field SGLang's scheduler would fail on (hardening/scheduler_fields.py),
outside the bounds a laid-out request needs (limits.py), with an empty prompt or a client-made layout
hint (intake.py), before SGLang's own checks.

Every tokenization path (single, batch, n > 1, OpenAI) ends here with the
request's final input_ids, markup already removed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend import intake, limits, state
from sglang_mepic.hardening import scheduler_fields

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
HOOK_TYPE = HookType.BEFORE


def hook(manager: TokenizerManager, obj: GenerateReqInput | EmbeddingReqInput, input_ids: list[int], *args: Any,
         **kwargs: Any) -> None:
    try:
        scheduler_fields.check(manager, obj)
        limits.check(manager, obj, input_ids)
    except ValueError as e:
        raise state.relabel(obj, e) from None
    intake.check(obj, input_ids)
