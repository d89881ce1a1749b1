"""Requests getting their KV row: what a planned request keeps, copies and reports.

A planned request holds the stored chunks it will read (residency.py). The
requests of a batch are admitted just before the batch allocates (patch
schedule_batch_prepare_for_extend): each then keeps what it holds until it
releases its row, and its plan is fixed. EPIC's admitted requests copy their
reused pages into pages of their own here; CacheBlend's copy the stored KV of
their chunk tokens into the pages SGLang has just allocated for them
(`copy_sources`), so each page is charged once, as in EPIC.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import torch

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native

from sglang_mepic import modes
from sglang_mepic.cache import report
from sglang_mepic.cache.link import Link, link_of

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_mepic.cache.planner import Planned
    from sglang_mepic.pages.chunk_store import ChunkStore
    from sglang_mepic.pages.pool_pages import PoolPages
    from sglang_mepic.pages.refs import PageRefs
    from sglang_mepic.tiers.levels import Tiers

logger = logging.getLogger(__name__)


def private_copy_slots(link: Link, mode: modes.Mode) -> int:
    """KV slots of the private copy EPIC makes at admission of the stored pages `link` reads (the ones its
    match injected); 0 where none is made: another mode, a compile row, nothing reused, or pages loaded
    from the host for it alone (`--mepic-chunk-store host`), which are its copy already."""
    if not modes.copies_private_prefix(mode) or link.compile or link.injected is None or link.held_private:
        return 0
    return len(link.injected)


class Admission:
    """Built by MepicRadixCache with what it reads: the pool's pages and their holders, the chunk store,
    the tiers' lookup counts, the KV buffers (EPIC's and CacheBlend's copies), the cache's eviction (room
    for EPIC's copies) and the totals it adds each admitted request's figures to."""

    def __init__(self, *, pages: PoolPages, refs: PageRefs, store: ChunkStore, tiers: Tiers, kv_pool: MHATokenToKVPool,
                 evict: Callable[[EvictParams], EvictResult], counters: report.Counters, mode: modes.Mode,
                 canonical_from: int | None, page_size: int) -> None:
        self.pages, self.refs, self.store, self.tiers, self.kv_pool = pages, refs, store, tiers, kv_pool
        self.evict, self.counters = evict, counters
        self.mode, self.canonical_from, self.page_size = mode, canonical_from, page_size

    def admit(self, req: Req) -> bool:
        """The request is about to get its KV row: hold the pages it reads, fix its plan, count it.
        False: nothing to do (not laid out, or admitted in an earlier batch: a chunked prefill's next part)."""
        link = link_of(req)
        if link is None or link.admitted:
            return False
        link.admit()  # it keeps what it holds (residency.py) until its release
        if not link.compile:
            # Computed for it: by compile rows in its batch (add_request put them there), or in an
            # earlier batch it waited for.
            link.made_for.update(link.compiling)
            link.compiled = tuple(i for i, key in enumerate(link.keys) if key in link.made_for)
            if link.found is not None:
                link.found = ["absent" if key in link.made_for else where for key, where in zip(link.keys, link.found)]
            for where in link.found or ():
                self.tiers.lookups[where] += 1
            if link.keys:
                logger.info("MEPIC request %s: %d chunk(s) found %s; %d computed in its batch", req.rid,
                            len(link.keys), ", ".join(f"{n} {tier}" for tier, n in Counter(link.found).items()),
                            len(link.compiled))
            for key in link.keys:  # counts hits and misses, refreshes LRU order
                self.store.lookup(key)
        plan = cast("Planned", link.planned).plan  # planned: it was admitted
        hits = plan.hits if plan is not None else sum(1 for k in link.keys if self.store.peek(k) is not None)
        report.count_admitted(link, req.prefix_len, self.counters, self.mode, self.canonical_from or 0,
                               self.page_size, hits)
        return True

    def copy_private(self, req: Req, reserve: int) -> None:
        """EPIC: the private copy of a request just admitted (`_copy_private`), made once the round's requests
        that were not admitted have let go of their chunks: SGLang counted those pages as evictable when it
        charged this copy (batch_join), and a request planned after this one may have pinned them since.

        reserve: pages the batch's own extends will take right after (the copies leave them free).
        """
        link = link_of(req)
        if link is not None and link.admitted and private_copy_slots(link, self.mode):
            self._copy_private(link, reserve)

    def _copy_private(self, link: Link, reserve: int) -> None:
        """EPIC: the stored pages the request reads become a copy in pages of its own, before
        its forward (as EPIC loads, then computes the rest); the store's pages are let go.

        SGLang's budget has counted these pages with the request (batch_join), and its pins
        were sized so that the copy fits beside them (MepicRadixCache._pin_budget): evicting
        the tree and unheld chunks always makes room. Should it not, that is a bug in that
        accounting, not a state of the pool: the request still reads the same KV, in place
        (`private_copy_fallbacks`, which every capacity cell reports and the tests hold at 0),
        rather than fail, and the error is logged.
        """
        src = cast(torch.Tensor, link.injected)  # admit() checked it is not None
        n = len(src) // self.page_size
        short = n + reserve - self.pages.available()
        if short > 0:
            self.evict(EvictParams(num_tokens=short * self.page_size))
        pages = self.refs.alloc(n) if self.pages.available() >= n + reserve else None
        if pages is None:
            self.counters.private_copy_fallbacks += 1
            logger.error("epic: no room for a private copy of %d pages (%d free, %d reserved for the batch's "
                         "extends) although SGLang's budget counted it; this request reads the store's pages in "
                         "place", n, self.pages.available(), reserve)
            return
        dst = self.pages.slots(pages)
        # SGLang declares the buffers None until the pool makes them, as it has by now.
        k, v = cast("list[torch.Tensor]", self.kv_pool.k_buffer), cast("list[torch.Tensor]", self.kv_pool.v_buffer)
        move_kv_cache_native(k, v, dst, src.to(dst.device))
        self.refs.release(link.held)
        link.held = list(pages)
        link.injected = dst

    def copy_sources(self, req: Req, row_slots: torch.Tensor) -> None:
        """CacheBlend: SGLang has allocated the request's extend; every token that reads stored
        KV gets it now in its own slot, in the layers from the check layer on (the forward
        compares it there and keeps it after it for the tokens not selected for recompute:
        backend.py). Once the whole prompt has its slots, the stored pages are let go: each
        page is charged once.

        row_slots: the request's row of `req_to_token` (physical slot of each of its slots).
        """
        link = link_of(req)
        if link is None or link.sources is None or not link.held:
            return
        start, end = req.prefix_len, min(req.prefix_len + req.extend_len, len(link.sources))
        src = torch.as_tensor(link.sources[start:end], dtype=torch.int64)
        take = torch.nonzero(src >= 0).flatten()
        if take.numel():
            dst = row_slots[start:end].to(torch.int64)[take.to(row_slots.device)]
            # Layers before the check layer are computed for every token and overwrite it.
            k, v = cast("list[torch.Tensor]", self.kv_pool.k_buffer), cast("list[torch.Tensor]", self.kv_pool.v_buffer)
            first = modes.blend_check_layer(self.mode, len(k))
            move_kv_cache_native(k[first:], v[first:], dst,
                                 src[take].to(dst.device))
        if end >= len(link.sources):  # chunked prefill: the last part has its slots
            self.refs.release(link.held)
            link.held = []
