"""An embedding request of the wrong shape (a list of rids on one input) is a 400, not a 500
(sglang_mepic.hardening.body_types)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening import body_types

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.io_struct.EmbeddingReqInput.normalize_batch_and_arguments"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], obj: EmbeddingReqInput, *args: Any, **kwargs: Any) -> None:
    return body_types.normalize(original, obj, *args, **kwargs)
