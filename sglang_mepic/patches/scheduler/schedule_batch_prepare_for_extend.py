"""Admit laid-out requests before a batch allocates, and write their positions after
(`extend.prepare_extend`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import extend

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], batch: ScheduleBatch, *args: Any, **kwargs: Any) -> None:
    return extend.prepare_extend(original, batch, *args, **kwargs)
