"""A scheduling round of the mepic cache: requests wait for their chunks' compiles, and
requests planned but not admitted let go of their chunk pages at its end.

A request whose chunk is neither stored nor done compiling is held out of the
waiting queue for the round (compiles.py), so that SGLang neither plans nor
admits it before the compile's pages are in the store; it is put back at the
head of the queue when the round ends.

A request holds the stored chunks it will read from the moment it is planned, so the
scheduler's memory check, which follows right after, does not count them as evictable.
Requests left waiting must not keep them past the round, or chunks wanted only by
waiting requests could fill the pool. A round that forms a batch lets go earlier, before
the batch allocates (patch schedule_batch_prepare_for_extend); this covers the rounds
that form none.

The batch's prefill stats (the log's `#new-token` and `#cached-token`, and the
cache-hit metrics) count slots; for laid-out requests they are brought to real
tokens, and reuse of chunks compiled for the request itself is not a hit, as in
its response's `cached_tokens`.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.radix_cache import MepicRadixCache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
HOOK_TYPE = HookType.AROUND


def hook(original, scheduler, *args, **kwargs):
    mepic = isinstance(scheduler.tree_cache, MepicRadixCache)
    held = scheduler.tree_cache.hold_back(scheduler.waiting_queue) if mepic else []
    if held:
        ids = {id(req) for req in held}
        scheduler.waiting_queue = [req for req in scheduler.waiting_queue if id(req) not in ids]
    try:
        plan = original(scheduler, *args, **kwargs)  # a NextBatchPlan
    finally:
        if held:
            scheduler.waiting_queue = held + scheduler.waiting_queue
        if mepic:
            scheduler.tree_cache.end_round()
    batch = plan.batch_to_run
    stats = getattr(batch, "prefill_stats", None)
    if stats is not None and isinstance(scheduler.tree_cache, MepicRadixCache):
        _count_real_tokens(stats, batch.reqs[:stats.num_new_seqs], scheduler.tree_cache)
    return plan


def _count_real_tokens(stats, new_reqs, tree) -> None:
    for req in new_reqs:
        link = getattr(req, "mepic", None)
        if link is None:
            continue
        prefix, end = min(req.prefix_len, link.size), min(req.prefix_len + req.extend_len, link.size)
        not_hit = (prefix - link.real_slots(0, prefix)) + link.compiled_reuse(tree.canonical_from or 0, tree.page_size)
        stats.log_hit_tokens = max(0, stats.log_hit_tokens - not_hit)
        stats.log_device_hit_tokens = max(0, stats.log_device_hit_tokens - not_hit)
        stats.log_input_tokens -= max(0, end - prefix) - link.real_slots(prefix, end)
