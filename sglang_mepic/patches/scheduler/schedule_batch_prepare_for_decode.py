"""At each decode step the chunk cache's figures are sampled after the step's KV allocation
(peak pages, /metrics)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
HOOK_TYPE = HookType.AFTER


def hook(result: None, batch: ScheduleBatch, *args: Any, **kwargs: Any) -> None:
    if (tree := mepic_cache(batch)) is not None:
        tree.report.sample()
    return result
