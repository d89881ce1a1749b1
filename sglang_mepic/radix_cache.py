"""The `mepic` radix-cache backend (`--radix-cache-backend mepic`).

It extends SGLang's Python `RadixCache` rather than the default
`UnifiedRadixCache`: the unified tree keeps its nodes in a Rust core that a
plugin cannot give a new node kind, while the Python tree is a plain class whose
paths can be extended in Python. For a request without chunk markup it is
SGLang's own `RadixCache`, unchanged.

A laid-out request (request_layout.py) is planned against the chunk store each
time the scheduler matches it (plan.py). In the shared modes its token ids are
reordered so that the reused canonical pages come first; the tree matches that
key as far as it can and the rest of the reused pages are appended from the
store ("injected"), so SGLang's prefix is exactly the reused KV and its extend
is exactly what MEPIC recomputes. The tree then caches the request under its
planned key: an identical request matches all the way through, first blocks
included.

A chunk's canonical pages come from a standalone compile: the tokenizer side
sends the chunk alone as a small internal request (`compile`), and when that
request is released its pages join the store.

Pages are shared between the store, tree nodes and requests, so the cache
attaches a `PageRefs` to SGLang's allocator: every page freed there drops one
holder (patches `paged_allocator_free_page_ids`, `paged_allocator_free`). The
`Ledger` keeps, as holders change, what SGLang asks of the cache at every step
(`evictable_size`); `recount_freeable` is the same answer from scratch. Holders:
- the store: one per canonical page it keeps;
- a tree node: one per page of its value (SGLang's own accounting, plus one
  taken here when a node is created over injected pages);
- a request: one per page of each stored chunk it reads, from the moment it is
  planned. The scheduler checks a request's memory budget right after planning
  it, so the chunks it will pin are not counted as evictable there. A request
  that is not admitted lets go when the scheduling round ends (`end_round`),
  an admitted one when it releases its row.

A chunk the store evicts is copied to the host tier first, and every compiled
chunk is written through to shared storage (tiers.py, storage.py). Planning a request loads
a chunk it needs back from those tiers into fresh pages (evicting tree leaves
and unheld chunks for room), so a compile of a chunk that was evicted costs a
copy and its first block instead of the whole chunk.
"""

import dataclasses
import hashlib
import heapq
import itertools
import json
import logging
import math
import os
import time
from array import array
from collections import Counter
from dataclasses import dataclass

import torch

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult
from sglang.srt.mem_cache.evict_policy import (FIFOStrategy, FILOStrategy, LFUStrategy, LRUStrategy,
                                               PriorityStrategy, SLRUStrategy)
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from sglang_mepic import config, metrics, storage
from sglang_mepic.chunk_store import ChunkStore
from sglang_mepic.compiles import Compiles
from sglang_mepic.ledger import Ledger
from sglang_mepic.link import Link
from sglang_mepic.pages import PageRefs
from sglang_mepic.plan import make_plan, page_tag, private, sources
from sglang_mepic.pool_pages import PoolPages
from sglang_mepic.request_layout import hints, masked_key
from sglang_mepic.segments import span_hash
from sglang_mepic.tiers import Tiers

logger = logging.getLogger(__name__)

BACKEND_NAME = "mepic"

# Eviction strategies under which a node's priority never falls as the node is used (access
# time, hit count, the max'd request priority) or never changes (creation time): a heap kept
# across evict calls stays in SGLang's order. Under the others (mru: -access time; tlru; any
# other) each call builds its heap from every evictable leaf, as SGLang's `evict` does.
KEPT_HEAP_STRATEGIES = (LRUStrategy, LFUStrategy, FIFOStrategy, FILOStrategy, PriorityStrategy, SLRUStrategy)

# The allocator methods through which pages go back: the cache frees whole pages with
# `free_page_ids` (pool_pages.py; eviction never calls `free_segment`) and counts the frees of
# `free` (patches paged_allocator_free*). An allocator that overrides one of them would be bypassed.
FREE_PATH = ("free", "free_page_ids", "free_segment", "free_segments", "_release_page_ids")


def check_allocator(allocator) -> None:
    """Refuse a KV allocator the cache cannot free through (e.g. SGLang's PageInterleavePoolAllocator,
    which keeps free pages per owner class and overrides `free_segment` and `_release_page_ids`)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    name = type(allocator).__name__
    if not isinstance(allocator, PagedTokenToKVPoolAllocator):
        raise ValueError(f"--radix-cache-backend mepic needs SGLang's paged KV allocator, not {name}")
    changed = [m for m in FREE_PATH if getattr(type(allocator), m) is not getattr(PagedTokenToKVPoolAllocator, m)]
    if changed:
        raise ValueError(f"--radix-cache-backend mepic cannot free pages through {name}: it overrides "
                         f"{', '.join(changed)}, which the cache's eviction and page counting would bypass "
                         "(they return whole pages with free_page_ids); use the default paged allocator")


@dataclass
class Counters:
    recomputed_tokens: int = 0   # chunk and prompt tokens computed in a request's context
    reused_tokens: int = 0       # chunk tokens served from the store (shared or copied)
    compiled_chunks: int = 0     # standalone compiles that produced new canonical pages
    compiled_tokens: int = 0     # real tokens computed by standalone compiles
    private_copy_fallbacks: int = 0  # epic requests that read stored pages in place for lack of room


class MepicRadixCache(RadixCache):
    # Set while SGLang sorts the waiting queue (patch schedule_policy_compute_prefix_matches):
    # matches then plan, pin and load nothing (`_match_unplanned`).
    prioritising = False

    def __init__(self, params, model_fingerprint: str = "", mode: config.Mode | None = None,
                 canonical_from: int | None = -1, tiers: Tiers | None = None):
        check_allocator(params.token_to_kv_pool_allocator)
        super().__init__(params)
        self.model_fingerprint = model_fingerprint
        self.mode = mode or config.mode()
        self.canonical_from = config.canonical_from() if canonical_from == -1 else canonical_from
        self.placement = config.placement()
        self.pages = PoolPages(params.token_to_kv_pool_allocator)
        self.refs = PageRefs(self.pages)
        params.token_to_kv_pool_allocator.mepic_refs = self.refs
        self.store = ChunkStore(self.refs, on_evict=self._demote)
        self.ledger = Ledger(self.refs, self.store)
        self.refs.on_change = self.ledger.touch
        self.store.on_change = self.ledger.chunk_changed
        self.kv_pool = params.token_to_kv_pool_allocator.get_kvcache()
        self.tiers = tiers or Tiers(self.kv_pool, self.page_size, config.host_tier_gb(),
                                    storage.from_settings(model_fingerprint))
        self._owners = itertools.count(1)
        self._unadmitted: dict[int, Link] = {}  # planned, holding their chunks, not admitted yet
        self.compiles = Compiles()
        self.counters = Counters()
        self.peak_pages_in_use = 0
        self._sampled = None  # the counts `sample` compares, at the last sample

    # ---- the request side -------------------------------------------------

    def link(self, req) -> Link | None:
        link = getattr(req, "mepic", None)
        if link is None:
            h = hints(getattr(req, "kv_hints", None))
            if h is None:
                return None
            link = Link(array("q", req.origin_input_ids), h.pads, h.chunks, h.compile, h.compiles)
            # Everything that keeps SGLang's tree entries apart keeps chunks apart too.
            # repr keeps None apart from "None" and a field's text from the separators: a client's
            # extra_key or cache_salt must never spell another tenant's namespace. SGLang treats an
            # empty cache_salt as none, and so does this.
            namespace = repr((getattr(req, "extra_key", None), getattr(req, "cache_salt", None) or None,
                              getattr(req, "lora_id", None)))
            masked = masked_key(link.natural, link.pads)
            link.keys = [span_hash(masked[s:e], self.placement, self.page_size, self.model_fingerprint, namespace)
                         for s, e in link.chunk_slots]
            link.owner = next(self._owners)
            req.mepic = link
        return link

    def hold_back(self, reqs) -> list:
        """The requests, of the waiting `reqs`, that must wait for a chunk's compile (compiles.py)."""
        linked = [(req, link) for req in reqs if (link := self.link(req)) is not None]
        return [req for req, _ in self.compiles.waiting(linked, lambda key: key in self.store)]

    def _plan(self, req, link: Link, params) -> None:
        """Plan the request against the store; in shared modes, put its ids in planned order.

        The request holds every stored chunk it will read from here on; chunks missing
        from the device pool are loaded back from the tiers below when they have them.
        """
        self._let_go(link)
        resident, found = {}, []
        for (start, end), key in zip(link.chunk_slots, link.keys):
            pages, where = self.store.peek(key), "device"
            if pages is None and not self._keeps(start, end):  # nothing of it is ever stored
                where = "absent"
            elif pages is None:  # "absent" too when the entry was rejected or there is no room
                pages, where = self._load(key, (end - start) // self.page_size - self.canonical_from)
            if pages is not None and key not in resident:
                self.refs.acquire(pages)  # before the next load, which may evict
                resident[key] = pages
                link.held += pages
            found.append(where)
        # Where each chunk was found when first planned. A plan that found nothing (or could not
        # load it for lack of room) yields to a later one, as the request is computed by the last.
        link.found = found if link.found is None else [new if old == "absent" else old
                                                      for old, new in zip(link.found, found)]
        if link.held:
            self._unadmitted[id(link)] = link
        link.order = link.sources = link.private_key = None
        link.plan = None
        # Input logprobs from a slot on: as SGLang limits its prefix there, chunks past it are computed.
        start = req.logprob_start_len if getattr(req, "return_logprob", False) and req.logprob_start_len >= 0 else None
        if link.compile or self.mode.shares:
            link.plan = make_plan(link.size, self.page_size, link.spans(), resident, self.canonical_from, start)
        elif self.mode.kind is config.Kind.EPIC:
            # Planned like mepic: each chunk's leading pages are computed, its other pages
            # form the prefix, copied into pages of the request's own at admission (`_copy_private`).
            lead = -(-self.mode.tokens // self.page_size)
            tail = {key: pages[lead:] for key, pages in resident.items()}
            link.plan = private(make_plan(link.size, self.page_size, link.spans(), tail, lead, start),
                                str(link.owner))
        elif self.mode.kind is config.Kind.CACHEBLEND:
            natural_pos = link.natural_positions(link.size).tolist()
            link.sources, _, _ = sources(link.size, self.page_size, link.spans(), resident, natural_pos, 0, start)
            # Which slots are recomputed is chosen per request, over its whole extend, so blended KV
            # is this request's alone: no other request (not one with the same tokens, not one
            # sharing a prefix) may match it in the tree.
            link.private_key = page_tag(f"{link.owner}\x1fcacheblend", 0) if any(s >= 0 for s in link.sources) \
                else None
        if link.plan is not None and link.plan.reused and link.compile and self._holds_compile(link, params):
            link.plan = None  # in natural order, the tree's earlier compile of it costs nothing
        if link.plan is not None and link.plan.reused:
            link.order = link.plan.slot_order()
            # Same length, new order: fill_ids is rebuilt from it below (it would go stale).
            req.origin_input_ids[:] = array("q", (link.natural[s] for s in link.order))
        else:
            req.origin_input_ids[:] = link.natural
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids

    def match_prefix(self, params):
        req = params.req
        link = self.link(req) if req is not None else None
        if link is None:
            return super().match_prefix(params)
        key = params.key
        if link.admitted:  # the plan is fixed while the request holds its row
            params.key = RadixKey(link.masked(key.token_ids), key.extra_key, is_bigram=key.is_bigram,
                                  limit=key.limit, cache_salt=key.cache_salt)
            return super().match_prefix(params)
        if self.prioritising:
            return self._match_unplanned(link, params)
        self._plan(req, link, params)
        ids = req.full_untruncated_fill_ids
        params.key = RadixKey(link.masked(ids), key.extra_key, is_bigram=key.is_bigram, limit=key.limit,
                              cache_salt=key.cache_salt)
        result = super().match_prefix(params)
        link.injected, link.tree_len, link.tree_took = None, result.device_prefix_len, 0
        plan = link.plan
        if plan is None or not plan.reused:
            return result
        limit = len(ids) if key.limit is None else min(key.limit, len(ids))
        end = min(plan.prefix_slots, limit // self.page_size * self.page_size)
        if end <= result.device_prefix_len:
            return result
        slots = plan.reused_slots()[result.device_prefix_len:end]
        link.injected = torch.tensor(slots, dtype=torch.int64, device=self.pages.allocator.device)
        return result._replace(device_prefix_len=end)

    def _match_unplanned(self, link: Link, params):
        """The match that sorts the waiting queue (lpm and the other cache-aware policies): what
        the tree holds for the request in natural order, with no plan, no chunk held and nothing
        loaded from the tiers. Planning it would pin its chunks until the round ends, and the
        request at the head, whose budget is checked after, would see them as unevictable."""
        # With the output so far of a request retracted to the queue.
        return self._match_natural(link, params, params.key.token_ids[link.size:])

    def _match_natural(self, link: Link, params, output=()):
        """What the tree holds for the request in natural slot order (pads as PAD_ID), unplanned."""
        key = params.key
        ids = array("q", masked_key(link.natural, link.pads))
        ids.extend(output)
        natural = RadixKey(ids, key.extra_key, is_bigram=key.is_bigram, limit=key.limit, cache_salt=key.cache_salt)
        return super().match_prefix(dataclasses.replace(params, key=natural))

    def _holds_compile(self, link: Link, params) -> bool:
        """Whether the tree still holds this compile request, in natural order, through its chunk.

        Planned, a compile of a stored chunk computes its first block; when the tree holds the
        chunk's earlier compile whole, the natural order costs nothing.
        """
        return self._match_natural(link, params).device_prefix_len >= link.chunk_slots[0][1]

    def _keeps(self, start: int, end: int) -> bool:
        """Whether the store keeps pages of a chunk over slots [start, end): not when every page
        of it is recomputed in context (`--mepic-recompute-blocks` at or above its page count)."""
        return self.canonical_from is not None and (end - start) // self.page_size > self.canonical_from

    def _load(self, key: str, num_pages: int) -> tuple[tuple[int, ...] | None, str]:
        """Copy a chunk from the host or file tier into fresh device pages and store it.

        Returns its pages and the tier it came from, or (None, "absent") when no tier has it
        sound or the pool has no room for it.
        """
        fetched = self.tiers.fetch(key, num_pages * self.page_size)
        if fetched is None:
            return None, "absent"
        pages = self.refs.alloc(num_pages)
        if pages is None:
            short = num_pages - self.pages.available()
            self.evict(EvictParams(num_tokens=short * self.page_size))
            pages = self.refs.alloc(num_pages)
            if pages is None:
                return None, "absent"
        self.tiers.place(fetched, self.pages.slots(pages))
        pages = self.store.put(key, tuple(pages))
        self.refs.release(pages)  # the store is now their only holder
        return pages, fetched[1]

    def _let_go(self, link: Link) -> None:
        """Drop the chunks a planned request holds (it is planned again, or was not admitted)."""
        self._unadmitted.pop(id(link), None)
        if link.held:
            self.refs.release(link.held)
            link.held = []

    def end_round(self) -> None:
        """A scheduling round is over: requests planned in it but not admitted let go of their chunks."""
        for link in list(self._unadmitted.values()):
            self._let_go(link)

    def _demote(self, key: str, pages: tuple[int, ...]) -> None:
        self.tiers.demote(key, self.pages.slots(pages))

    def prefix_device_indices(self, req) -> torch.Tensor:
        link = getattr(req, "mepic", None)
        path = self.path_device_indices(req.last_node)
        if link is not None and link.injected is not None:
            path = torch.cat([path[:link.tree_len], link.injected.to(path.device, path.dtype)])
        assert len(path) >= req.prefix_len, (req.rid, len(path), req.prefix_len)
        return path[:req.prefix_len]

    def admit(self, req, reserve: int = 0) -> None:
        """The request is about to get its KV row: hold the pages it reads, fix its plan, count it.

        reserve: pages the batch's own extends will take right after (EPIC's copies leave them free).
        """
        link = getattr(req, "mepic", None)
        if link is None or link.admitted:
            return
        self._unadmitted.pop(id(link), None)  # it keeps what it holds until its release
        link.admitted = True
        if self.mode.kind is config.Kind.EPIC and link.injected is not None and not link.compile:
            self._copy_private(link, reserve)
        prefix = min(req.prefix_len, link.size)
        if link.compile:
            computed = link.real_slots(prefix, link.size)
            self.counters.compiled_tokens += computed
            self.tiers.lookups[link.found[0]] += 1
            self.compiles.admitted(req.rid, link.found[0])
            link.report = {"mepic_residency": link.found[0], "mepic_compiled_tokens": computed}
            return
        if link.compiles:
            link.compiled = self.compiles.compiled(link)
            found = self.compiles.residency(link)
            # SGLang logs the compiles as ordinary prefill batches; say what they were.
            logger.info("MEPIC request %s: %d chunk(s) found %s; waited %.2f s for compiles", req.rid, len(found),
                        ", ".join(f"{n} {tier}" for tier, n in Counter(found).items()), link.waited)
        substituted = 0
        if link.sources is not None:  # CacheBlend: its selected fraction is computed after all
            substituted = sum(1 for s in link.sources[req.prefix_len:] if s >= 0)
            substituted -= math.ceil(self.mode.ratio * substituted)
        for key in link.keys:  # counts hits and misses, refreshes LRU order
            self.store.lookup(key)
        compiled = link.compiled_reuse(self.canonical_from or 0, self.page_size)
        cached = link.real_slots(0, prefix) + substituted - compiled
        recomputed = link.real_slots(prefix, link.size) - substituted
        plan_hits = link.plan.hits if link.plan is not None else sum(1 for s in link.spans()
                                                                     if self.store.peek(s.key) is not None)
        link.report = {"mepic_recomputed_tokens": recomputed, "mepic_chunk_hits": plan_hits,
                       "mepic_chunk_misses": len(link.keys) - plan_hits, "mepic_cached_tokens": cached,
                       "mepic_compiled_tokens": compiled}
        self.counters.recomputed_tokens += recomputed
        self.counters.reused_tokens += link.real_slots(0, prefix) if link.plan is not None else substituted

    def _copy_private(self, link: Link, reserve: int) -> None:
        """EPIC: the stored pages the request reads become a copy in pages of its own, before
        its forward (as EPIC loads, then computes the rest); the store's pages are let go.

        SGLang's budget did not count these pages. When they do not fit beside `reserve`
        (evicting the tree and unheld chunks for them), the request reads the store's
        pages in place instead: same KV, shared for once (`private_copy_fallbacks`).
        """
        src = link.injected
        n = len(src) // self.page_size
        short = n + reserve - self.pages.available()
        if short > 0:
            self.evict(EvictParams(num_tokens=short * self.page_size))
        pages = self.refs.alloc(n) if self.pages.available() >= n + reserve else None
        if pages is None:
            self.counters.private_copy_fallbacks += 1
            logger.warning("epic: no room for a private copy of %d pages; this request reads the store's "
                           "pages in place", n)
            return
        dst = self.pages.slots(pages)
        move_kv_cache_native(self.kv_pool.k_buffer, self.kv_pool.v_buffer, dst, src.to(dst.device))
        self.refs.release(link.held)
        link.held = list(pages)
        link.injected = dst

    def _insert_cache(self, req, token_ids, **kwargs):
        link = getattr(req, "mepic", None)
        if link is None:
            return super()._insert_cache(req, token_ids, **kwargs)
        key, kv_indices, existing = super()._insert_cache(req, link.masked(token_ids), **kwargs)
        if link.injected is not None:
            # New tree nodes over injected pages hold them from now on: give them a reference.
            start = max(existing, link.tree_len + link.tree_took)
            end = min(len(key), link.tree_len + len(link.injected))
            if end > start:
                self.refs.acquire(kv_indices[start:end:self.page_size].div(
                    self.page_size, rounding_mode="floor").tolist())
                link.tree_took = end - link.tree_len
        return key, kv_indices, existing

    def on_release(self, req, *, checkpointed: bool) -> None:
        link = getattr(req, "mepic", None)
        if link is not None:
            if link.compile and checkpointed:
                self._publish(req, link)
            if link.compile:
                self.compiles.released(req.rid)
            self._let_go(link)
            link.admitted, link.injected, link.tree_took = False, None, 0
        super().on_release(req, checkpointed=checkpointed)

    def _publish(self, req, link: Link) -> None:
        """A compiled chunk's pages (now owned by the tree) join the store."""
        (start, end), key = link.chunk_slots[0], link.keys[0]
        if not self._keeps(start, end) or req.kv.cache_protected_len < end or key in self.store:
            return
        row = self.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
        pages = row[start:end:self.page_size].div(self.page_size, rounding_mode="floor").tolist()
        canonical = tuple(pages[self.canonical_from:])
        self.store.put(key, canonical)
        self.tiers.persist(key, self.pages.slots(canonical))
        self.counters.compiled_chunks += 1

    # ---- tree nodes, as the ledger sees them ----------------------------------
    # Unlocked nodes hold their pages loosely (evictable); locking one pins them.

    def _node_pages(self, node) -> list[int]:
        pages = getattr(node, "pages", None)
        if pages is None:  # kept on the node: lock, unlock and evict read it again
            pages = node.pages = (node.value[::self.page_size] // self.page_size).tolist()
        return pages

    def _insert_helper(self, node, key, value, priority=0, inserted_len=0):
        matched, last = super()._insert_helper(node, key, value, priority, inserted_len)
        if matched < len(key):  # a new leaf, unlocked, over the rest of the key
            self.ledger.nodes_hold(self._node_pages(last))
        return matched, last

    def _update_leaf_status(self, node):
        # SGLang's evict heapifies every evictable leaf per call; under KEPT_HEAP_STRATEGIES this cache
        # keeps its heap across calls: a node is pushed when it becomes an evictable leaf (checked when popped).
        was = node in self.evictable_leaves
        super()._update_leaf_status(node)
        if not was and node in self.evictable_leaves and self._kept_heap:
            self._leaf_order += 1
            heapq.heappush(self._leaves, (self.eviction_strategy.get_priority(node), self._leaf_order, node))

    @property
    def _kept_heap(self) -> bool:
        """Whether eviction uses the heap kept across calls (`_next_leaf`), or builds one per call."""
        return type(self.eviction_strategy) in KEPT_HEAP_STRATEGIES

    def _leaves_by_call(self):
        """Evictable leaves in SGLang's order for a strategy whose priorities may fall (mru):
        SGLang's own heap, built from every evictable leaf for this call, of (priority, node)
        pairs (ties: TreeNode's order); a parent the caller's deletion left a leaf is pushed at
        its priority then, as SGLang's `evict` pushes it. The caller deletes each leaf it takes."""
        strategy = self.eviction_strategy
        heap = [(strategy.get_priority(n), n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        while heap:
            _, node = heapq.heappop(heap)
            if node not in self.evictable_leaves:
                continue
            yield node
            parent = node.parent
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (strategy.get_priority(parent), parent))

    def _next_leaf(self):
        """The evictable leaf SGLang's heap would pop first, or None (`_kept_heap` strategies).

        Entries go stale: the node was locked, got children or was deleted (skipped), or was
        used since it was pushed (pushed again at its new priority; priorities only grow:
        access time, hit count).
        """
        leaves = self._leaves
        if len(leaves) > 2 * len(self.evictable_leaves) + 1024:  # mostly stale: start over
            leaves[:] = [(self.eviction_strategy.get_priority(n), i, n) for i, n in enumerate(self.evictable_leaves)]
            heapq.heapify(leaves)
            self._leaf_order = len(leaves)
        while leaves:
            priority, _, node = heapq.heappop(leaves)
            if node not in self.evictable_leaves:
                continue
            now = self.eviction_strategy.get_priority(node)
            if now != priority:
                self._leaf_order += 1
                heapq.heappush(leaves, (now, self._leaf_order, node))
                continue
            return node
        return None

    def _split_node(self, key, child, split_len):
        pages = self._node_pages(child)
        parent = super()._split_node(key, child, split_len)
        cut = split_len // self.page_size
        parent.pages, child.pages = pages[:cut], pages[cut:]
        return parent

    def _delete_leaf(self, node):  # only `evict` deletes leaves
        self.ledger.nodes_let_go(self._node_pages(node))
        super()._delete_leaf(node)

    def inc_lock_ref(self, node):
        n = node
        while n is not None and n is not self.root_node:
            if n.lock_ref == 0:
                self.ledger.nodes_let_go(self._node_pages(n))
            n = n.parent
        return super().inc_lock_ref(node)

    def dec_lock_ref(self, node, params=None):
        n = node
        while n is not None and n is not self.root_node:
            if n.lock_ref == 1:
                self.ledger.nodes_hold(self._node_pages(n))
            n = n.parent
        return super().dec_lock_ref(node, params)

    # ---- memory -----------------------------------------------------------

    def _tree_holders(self) -> dict[int, int]:
        """Page -> number of unlocked tree nodes holding it (a walk of the whole tree)."""
        values = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.lock_ref == 0 and node.value is not None and len(node.value):
                values.append(node.value[::self.page_size])
        if not values:
            return {}
        pages, counts = torch.unique(torch.cat(values).div(self.page_size, rounding_mode="floor"),
                                     return_counts=True)
        return dict(zip(pages.tolist(), counts.tolist()))

    def recount_freeable(self) -> set[int]:
        """Pages that evicting every unlocked tree node and every unheld chunk would free,
        counted from scratch over the whole tree and store: the ledger's oracle in tests.

        A page is pinned when something other than an unlocked tree node or a stored chunk
        holds it (a request, a locked node). A chunk with no pinned page is evicted once the
        tree's unlocked nodes are gone (`evict`); its pages are freed when every chunk that
        shares them is evicted too.
        """
        holders = self._tree_holders()
        free = {p for p, n in holders.items() if self.refs.count(p) == n}
        loose = Counter()  # page -> evictable chunks holding it
        for pages in self.store.chunks():
            if all(self.refs.count(p) == holders.get(p, 0) + self.store.holding(p) for p in pages):
                loose.update(pages)
        free.update(p for p, n in loose.items() if n == self.store.holding(p))
        return free

    def evictable_size(self):
        # SGLang's tree count would count a page shared by nodes and the store once per holder.
        return self.ledger.freeable() * self.page_size

    def pages_in_use(self) -> int:
        """Pages running requests hold: allocated pages that evicting every unlocked tree node
        and every unheld chunk would not free (SGLang's "used" = total - available - evictable)."""
        total = self.pages.allocator.size // self.page_size
        return total - self.pages.available() - self.ledger.freeable()

    def done_with_sources(self, req) -> None:
        """A private-copy request's prefill is over: its copies are made, the sources can go."""
        link = getattr(req, "mepic", None)
        if link is not None and link.sources is not None and link.held:
            self.refs.release(link.held)
            link.held = []

    def evict(self, params: EvictParams) -> EvictResult:
        """Evict tree leaves (SGLang's heap, least recently used first), then unheld chunks (LRU),
        until `num_tokens` slots are freed.

        SGLang's own loop stops when the nodes it dropped add up to the request, but a node's
        page that the store or another node also holds frees nothing; so this is its loop, stopped
        by the pages actually freed (`PageRefs.freed` moves at once, inside a free group too),
        over a heap kept across calls (`_next_leaf`) rather than rebuilt from every leaf, where
        priorities only grow (`KEPT_HEAP_STRATEGIES`); under the others, SGLang's per-call heap.
        """
        if self.disable:
            return EvictResult()
        start_time, start = time.perf_counter(), self.refs.freed
        want = -(-params.num_tokens // self.page_size)
        last = []  # returned to the allocator together, after the walk
        leaves = iter(self._next_leaf, None) if self._kept_heap else self._leaves_by_call()
        while self.refs.freed - start < want and (node := next(leaves, None)) is not None:
            last += self.refs.releasable(self._node_pages(node))
            self._delete_leaf(node)  # tells the ledger; its parent, now a leaf, is pushed
            self.kv_events.record_remove(node)
        if last:
            self.pages.free(last)
        short = want - (self.refs.freed - start)
        if short > 0:  # the unlocked tree is gone: chunks with no pinned page free what they hold
            self.store.evict(short, loose=self.ledger.chunk_loose)
        evicted = (self.refs.freed - start) * self.page_size
        self.update_eviction_metrics(evicted, start_time)
        return EvictResult(num_tokens_evicted=evicted)

    def reset(self):
        # SGLang clears the allocator right after resetting the tree (flush_cache), so
        # the store and the counts are dropped, not released page by page.
        self._leaves, self._leaf_order = [], 0  # before SGLang's reset, which makes the root
        super().reset()
        if getattr(self, "store", None) is not None:
            self.store.forget()
            self.refs.forget()
            self.ledger.clear()
            self.tiers.clear_host()
            for link in self._unadmitted.values():
                link.held = []
            self._unadmitted.clear()
            self.peak_pages_in_use = 0
            self._sampled = None
            # The allocator is cleared right after this; say so without waiting for the next sample.
            metrics.publish({"kv_pages_in_use": 0, "kv_pages_in_use_peak": 0, "canonical_chunk_pages": 0,
                             "shared_pages": 0, "chunks_resident": 0,
                             "kv_pages_free": self.pages.allocator.size // self.page_size})

    def sample(self) -> None:
        """Take the figures after an allocation, and when idle: tracks the peak and feeds /metrics.

        Skipped while the counts below are what they were at the last sample (all O(1)):
        most decode steps allocate nothing, and an idle poll changes nothing. A finished
        request may change the freeable count alone (its pages go to the tree), a published
        compile the store's counts alone.
        """
        store = self.store
        counts = (self.pages.available(), self.ledger.freeable(), len(store), store.canonical_pages(),
                  self.refs.shared(), store.stats.hits, store.stats.misses, store.stats.evictions,
                  self.counters.compiled_chunks)
        if counts != self._sampled:
            self._sampled = counts
            metrics.publish(self.stats())

    def stats(self) -> dict:
        in_use = self.pages_in_use()
        self.peak_pages_in_use = max(self.peak_pages_in_use, in_use)
        return {
            "mode": self.mode.name,
            "page_size": self.page_size,
            "kv_pages_total": self.pages.allocator.size // self.page_size,
            "kv_pages_free": self.pages.available(),
            "kv_pages_in_use": in_use,
            "kv_pages_in_use_peak": self.peak_pages_in_use,
            "canonical_chunk_pages": self.store.canonical_pages(),
            "chunks_resident": len(self.store),
            "shared_pages": self.refs.shared(),
            "chunk_hits": self.store.stats.hits,
            "chunk_misses": self.store.stats.misses,
            "chunk_evictions": self.store.stats.evictions,
            "chunks_compiled": self.counters.compiled_chunks,
            "compiled_tokens": self.counters.compiled_tokens,
            "recomputed_tokens": self.counters.recomputed_tokens,
            "reused_tokens": self.counters.reused_tokens,
            "private_copy_fallbacks": self.counters.private_copy_fallbacks,
            **self.tiers.stats(),
        }


def model_fingerprint(model_config) -> str:
    """What makes KV reusable: the weights (path, revision), their dtype and the architecture."""
    hf = getattr(model_config, "hf_config", None)
    described = json.dumps(hf.to_dict() if hf is not None else {}, sort_keys=True, default=str)
    parts = [str(getattr(model_config, "model_path", "")), str(getattr(model_config, "revision", "")),
             str(getattr(model_config, "dtype", "")), described]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


ACTIVE: "MepicRadixCache | None" = None


def build(ctx) -> MepicRadixCache:
    global ACTIVE
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError("--radix-cache-backend mepic supports full-attention models only "
                         "(no sliding-window or state-space layers)")
    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend mepic does not support --enable-hierarchical-cache")
    config.placement()  # fail at start-up on a bad setting
    config.compile_sink()
    config.host_tier_gb()
    config.storage_config()
    config.storage_timeout()
    directory = config.storage_dir() if config.storage_backend() == "file" else None
    if directory is not None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--mepic-storage-dir {directory}: cannot create it ({e.strerror})") from None
        if not os.access(directory, os.W_OK):
            raise ValueError(f"--mepic-storage-dir {directory}: not writable")
    mode = config.mode()
    config.canonical_from()
    if ctx.disable_radix_cache and mode.reuses:
        raise ValueError(f"--mepic-mode {mode.name} needs the radix cache: drop --disable-radix-cache "
                         "or use --mepic-mode full")
    params = ctx.params
    if ctx.disable_radix_cache:
        params.disable = True
    ACTIVE = MepicRadixCache(params, model_fingerprint(ctx.model_config), mode)
    return ACTIVE
