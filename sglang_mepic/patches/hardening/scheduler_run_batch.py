"""A batch whose forward raises ends its requests with an error instead of the scheduler
process (`batch_guard.run`; what stays fatal is listed there)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening import batch_guard

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.utils import EmbeddingBatchResult, GenerationBatchResult

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], scheduler: Scheduler, batch: ScheduleBatch, *args: Any,
         **kwargs: Any) -> GenerationBatchResult | EmbeddingBatchResult:
    return batch_guard.run(original, scheduler, batch, *args, **kwargs)
