"""Admit laid-out requests to the chunk cache and write their positions when they are scheduled.

Every request passes `ScheduleBatch.prepare_for_extend` at each (chunked-)prefill
pass. Before SGLang allocates (which may evict), the new requests are admitted to
the mepic radix cache (they keep the chunk pages they have held since they were
planned) and the requests that were planned but not admitted let go of theirs.
After, each KV row is assigned: rows of laid-out requests get their plan's
positions (and, in private-copy modes, the slots their KV is copied from); every
other row is marked unplanned (identity positions). The cache's figures are
sampled right after the allocation (peak pages in use, /metrics).
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import positions
from sglang_mepic.radix_cache import MepicRadixCache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
HOOK_TYPE = HookType.AROUND


def hook(original, batch, *args, **kwargs):
    tree = batch.tree_cache if isinstance(batch.tree_cache, MepicRadixCache) else None
    if tree is not None:
        for req in batch.reqs:
            tree.admit(req)
        # Requests planned in this round but left waiting let go now: what they hold was
        # counted as evictable when the admitted ones were checked.
        tree.end_round()
    result = original(batch, *args, **kwargs)
    if tree is not None:
        tree.sample()
    position_map = positions.ACTIVE
    if position_map is None:  # another attention backend: nothing to write
        return result
    for req in batch.reqs:
        row = req.kv.req_pool_idx
        if row is None:
            continue
        link = getattr(req, "mepic", None)
        if link is not None:
            # Output tokens count too: a retracted request re-prefills them after its prompt.
            slots = len(req.origin_input_ids) + len(req.output_ids)
            device = position_map.req_to_pos.device
            position_map.assign(row, link.positions(slots).to(device), link.sources)
        else:
            position_map.release(row)
    return result
