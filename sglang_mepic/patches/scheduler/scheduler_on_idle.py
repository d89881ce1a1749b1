"""`/metrics` is brought up to date when the scheduler goes idle.

The MEPIC gauges are sampled after allocations (`prepare_for_extend`,
`prepare_for_decode`); the frees of the last requests come after the last
allocation, so without this the gauges kept their busy values (pages in use,
pages free) while `/server_info` showed the pool empty. `sample` publishes only
when one of the O(1) counts it compares changed, so repeated idle polls cost one
comparison; here at once (`busy=False`), where a busy step's sample publishes at
most every `report.PUBLISH_EVERY_S`. SGLang's own usage gauges had the same
staleness; they are published at the idle pass where the pool's use changed
(`metrics.refresh_sglang_usage_when_stale`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import metrics
from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.on_idle"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], scheduler: Scheduler, *args: Any, **kwargs: Any) -> None:
    metrics.refresh_sglang_usage_when_stale(scheduler)  # SGLang's own gauges, published by the original
    result = original(scheduler, *args, **kwargs)
    if (tree := mepic_cache(scheduler)) is not None:
        tree.report.sample(busy=False)
    return result
