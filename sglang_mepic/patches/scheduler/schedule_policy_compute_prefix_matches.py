"""Prioritising the waiting queue matches without planning (cache-aware schedule policies).

With `--schedule-policy lpm` (and dfs-weight, hrrn, shortest-prefill-first), each
scheduling round first matches every waiting request to sort the queue, when at most
128 wait. The mepic cache plans a request when it is matched: it holds the stored
chunks the request will read (and loads missing ones from the tiers) until the round
ends. Sorting the queue would so pin every waiting request's chunks, and the budget
of the request at the head, checked after, would no longer count them as evictable:
it could be refused round after round on an idle server. While the queue is sorted the
cache answers with what its tree holds for each request in natural order, and plans,
pins and loads nothing (`MepicRadixCache.match_prefix`); a request is planned when the
round comes to admit it, as under FCFS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import mepic_cache

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_policy import SchedulePolicy

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_policy.SchedulePolicy._compute_prefix_matches"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], policy: SchedulePolicy, *args: Any, **kwargs: Any) -> set[int]:
    if (tree := mepic_cache(policy)) is None:
        return original(policy, *args, **kwargs)
    tree.prioritising = True
    try:
        return original(policy, *args, **kwargs)
    finally:
        tree.prioritising = False
