"""Keep a batch item's index on the per-item request SGLang splits off, so that an
error about it can say which item it is (state.labelled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.frontend.state import ITEMS

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GenerateReqInput

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.io_struct.GenerateReqInput.__getitem__"
HOOK_TYPE = HookType.AFTER


def hook(result: GenerateReqInput, obj: GenerateReqInput, i: int, *args: Any, **kwargs: Any) -> GenerateReqInput:
    ITEMS.set(result, i)
    return result
