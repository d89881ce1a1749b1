"""Admit laid-out requests to the chunk cache and write their positions when they are scheduled.

Every request passes `ScheduleBatch.prepare_for_extend` at each (chunked-)prefill
pass. Before SGLang allocates (which may evict), the new requests are admitted to
the mepic radix cache (they keep the chunk pages they have held since they were
planned; EPIC's get their private copies) and the requests that were planned but
not admitted let go of theirs.
After, each KV row is assigned: rows of laid-out requests get their plan's
positions (and, in private-copy modes, the slots their KV is copied from); every
other row is marked unplanned (identity positions). The cache's figures are
sampled right after the allocation (peak pages in use, /metrics). In a batch that
returns input logprobs, each laid-out slot scores the next real token, not the
next slot, which may be a pad (logprobs.py).
"""

import torch
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic import positions
from sglang_mepic.logprobs import next_real_ids
from sglang_mepic.radix_cache import MepicRadixCache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
HOOK_TYPE = HookType.AROUND


def hook(original, batch, *args, **kwargs):
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
    if tree is not None:
        tree.sample()
        if batch.return_logprob and batch.extend_input_logprob_token_ids is not None:
            _score_real_tokens(batch)
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


def _score_real_tokens(batch) -> None:
    """Per request, SGLang lists the id each slot from its logprob start scores: the next slot's.
    For laid-out requests that becomes the next real token in natural order."""
    targets, at = batch.extend_input_logprob_token_ids, 0
    for req, skipped in zip(batch.reqs, batch.extend_logprob_start_lens):
        count = req.extend_len - skipped
        link = getattr(req, "mepic", None)
        first = req.prefix_len + skipped
        end = min(first + count, link.size) if link is not None else first
        if end > first:
            nxt = next_real_ids(link.natural, link.pad_slots())
            natural = link.order if link.order is not None else range(link.size)
            targets[at:at + end - first] = torch.tensor([nxt[natural[k]] for k in range(first, end)],
                                                        dtype=targets.dtype)
        at += count
