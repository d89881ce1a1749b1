"""A scheduler's page anatomy (the categories: pages/anatomy.py), for /server_info's `page_anatomy`.

Any radix cache: with SGLang's own, no page is a chunk's and every page no running request reads is
the tree's to evict. Gathered when asked, in the scheduler's loop (between batches), so the rows read
here are the ones the next forward reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from sglang_mepic.cache.link import link_of
from sglang_mepic.pages import anatomy

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool


def running_requests(scheduler: Scheduler) -> list[Req]:
    """The requests holding KV rows now: the running batch, the last prefill (merged into it at the next
    step), a chunked prefill's request. Each once; finished ones have given their rows back."""
    seen: dict[int, Req] = {}
    for batch in (getattr(scheduler, "running_batch", None), getattr(scheduler, "last_batch", None)):
        for req in getattr(batch, "reqs", None) or ():
            seen.setdefault(id(req), req)
    chunked = getattr(scheduler, "chunked_req", None)
    if chunked is not None:
        seen.setdefault(id(chunked), chunked)
    return [r for r in seen.values() if r.kv.req_pool_idx is not None and not r.finished()]


def of_scheduler(scheduler: Scheduler) -> dict[str, int]:
    # SGLang's pool builder hands the scheduler its pools typed `object`.
    allocator = cast("BaseTokenToKVPoolAllocator", scheduler.token_to_kv_pool_allocator)
    b = allocator.page_size
    num_pages = allocator.size // b + 1  # ids 1..size/b; page 0 is SGLang's padding page
    used = torch.ones(num_pages, dtype=torch.bool)
    used[0] = False
    used[allocator.get_all_free_pages().cpu().long()] = False
    running = running_requests(scheduler)
    held = [req.kv.kv_allocated_len for req in running]
    rows = torch.empty(0, 0, dtype=torch.int64)
    if running:  # one copy to the host for every row, not one per request
        index = torch.tensor([req.kv.req_pool_idx for req in running], dtype=torch.int64)
        table = cast("ReqToTokenPool", scheduler.req_to_token_pool).req_to_token
        rows = table[index.to(table.device), :max(held)].cpu().long() // b
    reads, compiling, pads = [], [], 0
    for req, n, pages in zip(running, held, rows):
        link = link_of(req)
        if link is not None and link.compile:
            compiling.append(pages[:n])
            continue
        reads.append(pages[:n])
        if link is not None:
            laid = min(n, link.size)
            pads += laid - link.real_slots(0, laid)
    tree = scheduler.tree_cache
    store, ledger = getattr(tree, "store", None), getattr(tree, "ledger", None)
    chunk_pages = torch.tensor(store.held_pages() if store is not None else [], dtype=torch.int64)
    evictable = torch.tensor(sorted(ledger.freeable_pages()), dtype=torch.int64) if ledger is not None else None
    counts = anatomy.count(used.nonzero().flatten(), reads, compiling, chunk_pages, evictable, num_pages)
    # Waiting: queued, no KV row yet (what a pool that binds makes wait).
    waiting = len(getattr(scheduler, "waiting_queue", None) or ())
    return {**counts, "used_pages": int(used.sum()), "pad_slots": pads, "running_requests": len(reads),
            "waiting_requests": waiting, "page_size": b}
