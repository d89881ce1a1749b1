"""End of a scheduling round: requests the mepic cache planned but the scheduler did not
admit let go of the chunk pages they were holding.

A request holds the stored chunks it will read from the moment it is planned, so the
scheduler's memory check, which follows right after, does not count them as evictable.
Requests left waiting must not keep them past the round, or chunks wanted only by
waiting requests could fill the pool. A round that forms a batch lets go earlier, before
the batch allocates (patch schedule_batch_prepare_for_extend); this covers the rounds
that form none.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.radix_cache import MepicRadixCache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
HOOK_TYPE = HookType.AROUND


def hook(original, scheduler, *args, **kwargs):
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        if isinstance(scheduler.tree_cache, MepicRadixCache):
            scheduler.tree_cache.end_round()
