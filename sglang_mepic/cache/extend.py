"""A batch's extend (`ScheduleBatch.prepare_for_extend`, patch `schedule_batch_prepare_for_extend`).

Before SGLang allocates (which may evict), the batch's requests are admitted
(they keep the chunk pages they have held since they were planned; EPIC's get
their private copies) and the round's others let go of theirs. After, each KV
row gets its plan's positions (and, in private-copy modes, the slots its KV is
copied from), and a request reading a chunk that a compile row in the batch
computes is pointed at that row's pages (`point_readers`); every other row is
marked unplanned (identity positions). In a batch that returns input logprobs,
each laid-out slot scores the next real token, not the next slot (logprobs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sglang_mepic.cache.link import link_of
from sglang_mepic.cache.logprobs import score_real_tokens
from sglang_mepic.cache.radix_cache import MepicRadixCache, mepic_cache
from sglang_mepic.pages import positions

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch


def point_readers(tree: MepicRadixCache, batch: ScheduleBatch) -> None:
    """SGLang has allocated `batch`: its readers of a compile row in it are pointed at the row's
    pages before the forward (readers.py)."""
    tree.readers.point(batch.reqs, tree.req_to_token_pool.req_to_token)


def prepare_extend(original: Callable[..., Any], batch: ScheduleBatch, *args: Any, **kwargs: Any) -> Any:
    tree = mepic_cache(batch)
    if tree is not None:
        # What the batch's extends will allocate (a page more each for alignment): EPIC's
        # private copies, made at admission, must leave it free.
        reserve = sum(-(-req.extend_len // tree.page_size) + 1 for req in batch.reqs)
        admitted = [req for req in batch.reqs if tree.admission.admit(req)]
        # Requests planned in this round but left waiting let go now, before EPIC's copies: what they
        # hold was counted as evictable when the admitted ones were checked.
        tree.residency.end_round()
        for req in admitted:
            tree.admission.copy_private(req, reserve)
    result = original(batch, *args, **kwargs)
    if tree is not None:
        point_readers(tree, batch)
    if tree is not None and batch.return_logprob and batch.extend_input_logprob_token_ids is not None:
        score_real_tokens(batch)
    position_map = positions.of(batch.req_to_token_pool)  # None under another attention backend
    for req in batch.reqs:
        row = req.kv.req_pool_idx
        if row is None:
            continue
        link = link_of(req)
        if link is not None:
            if tree is not None:
                tree.admission.copy_sources(req, batch.req_to_token_pool.req_to_token[row])
            if position_map is not None:
                # Output tokens count too: a retracted request re-prefills them after its prompt.
                slots = len(req.origin_input_ids) + len(req.output_ids)
                position_map.assign(row, link.positions(slots), link.sources)  # a host plan: assign copies it
        elif position_map is not None:
            position_map.release(row)
    if tree is not None:
        tree.report.sample()  # after CacheBlend's copies have let their stored pages go
    return result
