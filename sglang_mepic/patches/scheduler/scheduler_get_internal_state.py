"""`/server_info` (and `/get_server_info`) report the chunk cache's figures under `mepic`, and, for any
radix cache, where the pool's pages go under `page_anatomy` (cache/anatomy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import anatomy
from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.scheduler import Scheduler

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], scheduler: Scheduler, *args: Any, **kwargs: Any) -> GetInternalStateReqOutput:
    result = original(scheduler, *args, **kwargs)
    if (tree := mepic_cache(scheduler)) is not None:
        result.internal_state["mepic"] = tree.report.stats()
    result.internal_state["page_anatomy"] = anatomy.of_scheduler(scheduler)
    return result
