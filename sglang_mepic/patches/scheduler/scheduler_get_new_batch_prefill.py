"""A prefill round of the mepic cache: compile rows can be made in it, requests that must wait for
a chunk sit it out, and requests planned but not admitted let go of their chunk pages at its end
(`prefill_round.prefill_round`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import prefill_round

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import NextBatchPlan
    from sglang.srt.managers.scheduler import Scheduler

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], scheduler: Scheduler, *args: Any, **kwargs: Any) -> NextBatchPlan:
    return prefill_round.prefill_round(original, scheduler, *args, **kwargs)
