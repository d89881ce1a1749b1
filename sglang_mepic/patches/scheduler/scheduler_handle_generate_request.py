"""Count the generate requests the scheduler receives (`sglang_mepic:requests_received` on /metrics):
with compile rows made in the scheduler (compile_rows.py) it equals the requests clients sent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], scheduler: Scheduler, *args: Any, **kwargs: Any) -> None:
    if (tree := mepic_cache(scheduler)) is not None:
        tree.report.counters.requests_received += 1
    return original(scheduler, *args, **kwargs)
