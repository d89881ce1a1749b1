"""The mepic cache at SGLang's scheduling steps: a prefill round, and a batch's extend.

**A prefill round** (`Scheduler.get_new_batch_prefill`). A request whose chunk is
neither stored nor done compiling is held out of the waiting queue for the round
(compiles.py), so SGLang neither plans nor admits it before the compile's pages
are stored; so, briefly, is a compile whose request has not arrived yet. Both go
back to the head of the queue when the round ends. Requests
planned in the round but not admitted let go of their chunks at its end
(admission.py). The batch's prefill stats (the log's `#new-token` and
`#cached-token`, the cache-hit metrics) count slots; for laid-out requests they are
brought to real tokens, and reuse of chunks compiled for the request itself is
not a hit, as in its response's `cached_tokens`.

**A batch's extend** (`ScheduleBatch.prepare_for_extend`). Before SGLang allocates
(which may evict), the batch's requests are admitted (they keep the chunk pages
they have held since they were planned; EPIC's get their private copies) and the
round's others let go of theirs. After, each KV row gets its plan's positions
(and, in private-copy modes, the slots its KV is copied from); every other row is
marked unplanned (identity positions). In a batch that returns input logprobs,
each laid-out slot scores the next real token, not the next slot (logprobs.py).
"""

from sglang_mepic import context
from sglang_mepic.logprobs import score_real_tokens
from sglang_mepic.radix_cache import MepicRadixCache


def prefill_round(original, scheduler, *args, **kwargs):
    tree = scheduler.tree_cache if isinstance(scheduler.tree_cache, MepicRadixCache) else None
    held = tree.hold_back(scheduler.waiting_queue) if tree is not None else []
    if held:
        ids = {id(req) for req in held}
        scheduler.waiting_queue = [req for req in scheduler.waiting_queue if id(req) not in ids]
    try:
        plan = original(scheduler, *args, **kwargs)  # a NextBatchPlan
    finally:
        if held:
            scheduler.waiting_queue = held + scheduler.waiting_queue
        if tree is not None:
            tree.end_round()
    batch = plan.batch_to_run
    stats = getattr(batch, "prefill_stats", None)
    if stats is not None and tree is not None:
        _count_real_tokens(stats, batch.reqs[:stats.num_new_seqs], tree)
    return plan


def _count_real_tokens(stats, new_reqs, tree) -> None:
    for req in new_reqs:
        link = getattr(req, "mepic", None)
        if link is None:
            continue
        prefix, end = min(req.prefix_len, link.size), min(req.prefix_len + req.extend_len, link.size)
        not_hit = (prefix - link.real_slots(0, prefix)) + link.own_reuse  # counted at admission
        stats.log_hit_tokens = max(0, stats.log_hit_tokens - not_hit)
        stats.log_device_hit_tokens = max(0, stats.log_device_hit_tokens - not_hit)
        stats.log_input_tokens -= max(0, end - prefix) - link.real_slots(prefix, end)


def prepare_extend(original, batch, *args, **kwargs):
    tree = batch.tree_cache if isinstance(batch.tree_cache, MepicRadixCache) else None
    if tree is not None:
        # What the batch's extends will allocate (a page more each for alignment): EPIC's
        # private copies, made at admission, must leave it free.
        reserve = sum(-(-req.extend_len // tree.page_size) + 1 for req in batch.reqs)
        for req in batch.reqs:
            tree.admit(req, reserve)
        # Requests planned in this round but left waiting let go now: what they hold was
        # counted as evictable when the admitted ones were checked.
        tree.end_round()
    result = original(batch, *args, **kwargs)
    if tree is not None and batch.return_logprob and batch.extend_input_logprob_token_ids is not None:
        score_real_tokens(batch)
    position_map = context.current().positions  # None under another attention backend
    for req in batch.reqs:
        row = req.kv.req_pool_idx
        if row is None:
            continue
        link = getattr(req, "mepic", None)
        if link is not None:
            if tree is not None:
                tree.copy_sources(req, batch.req_to_token_pool.req_to_token[row])
            if position_map is not None:
                # Output tokens count too: a retracted request re-prefills them after its prompt.
                slots = len(req.origin_input_ids) + len(req.output_ids)
                position_map.assign(row, link.positions(slots).to(position_map.req_to_pos.device), link.sources)
        elif position_map is not None:
            position_map.release(row)
    if tree is not None:
        tree.sample()  # after CacheBlend's copies have let their stored pages go
    return result
