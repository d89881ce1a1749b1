"""The `mepic` radix-cache backend (`--radix-cache-backend mepic`): SGLang's tree, plus chunks.

It extends SGLang's Python `RadixCache` rather than the default
`UnifiedRadixCache`: the unified tree keeps its nodes in a Rust core that a
plugin cannot give a new node kind, while the Python tree is a plain class whose
paths can be extended in Python. For a request without chunk markup it is
SGLang's own `RadixCache`, unchanged.

This class keeps the tree work; each other job has its module, and the walk of
a laid-out request through them is:

    link                  the request's shape and chunk keys, once (link.Linker)
    match_prefix (here)   Residency.find -> planner.plan -> the tree's match of the
                          planned key, plus the reused pages the tree lacks (injected)
    admit                 admission.py: plan fixed, EPIC's private copy, report.py
    compile rows          compile_rows.py: a chunk no tier holds is computed in the
                          batch of its first reader (extend.py points the reader at it)
    insert / release      here: the tree caches the request under its planned key;
                          a compile row's pages join the chunk store (`_publish`)

Side effects of `match_prefix` on a laid-out request (SGLang's own match only
splits nodes and refreshes their access time): the request lets go of what an
earlier plan pinned, pins every stored chunk it will read (until it is admitted,
or the round ends), may load chunks back from the host or storage tier into
fresh pages (evicting tree leaves and unheld chunks for room), and has its
`origin_input_ids` put in planned order. Matches made to sort the waiting queue
(`prioritising`) do none of this.

Pages are shared between the store, tree nodes and requests: see docs/design.md,
Ownership. Tree nodes report to the `Ledger` as they are created, locked,
unlocked and deleted, so `evictable_size` stays exact at O(1).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey, TreeNode
from sglang.srt.managers.schedule_policy import CLIP_MAX_NEW_TOKENS

from sglang_mepic import env, modes
from sglang_mepic.cache import compile_rows, planner
from sglang_mepic.cache.admission import Admission
from sglang_mepic.cache.report import CacheReport
from sglang_mepic.cache.link import Link, Linker, link_of
from sglang_mepic.cache.readers import Readers
from sglang_mepic.cache.readiness import Readiness
from sglang_mepic.cache.residency import Residency
from sglang_mepic.pages import ownership
from sglang_mepic.pages.chunk_store import ChunkStore
from sglang_mepic.pages.leaves import Leaves
from sglang_mepic.pages.ledger import Ledger
from sglang_mepic.pages.pool_pages import PoolPages, check_allocator
from sglang_mepic.pages.refs import PageRefs
from sglang_mepic.tiers import storage
from sglang_mepic.tiers.agreement import Agreement
from sglang_mepic.tiers.levels import Tiers

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (DecLockRefParams, DecLockRefResult, IncLockRefResult,
                                                        MatchPrefixParams, MatchResult)
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.events import KVCacheEventRecorder

    from sglang_mepic.cache.plan import Plan
    from sglang_mepic.cache.residency import Found


class MepicRadixCache(RadixCache):
    # Set while SGLang sorts the waiting queue (patch schedule_policy_compute_prefix_matches):
    # matches then plan, pin and load nothing (`_match_unplanned`).
    prioritising = False

    def __init__(self, params: CacheInitParams, model_fingerprint: str = "", mode: modes.Mode | None = None,
                 canonical_from: int | None = -1, tiers: Tiers | None = None,
                 settings: env.Settings | None = None) -> None:
        check_allocator(params.token_to_kv_pool_allocator)
        allocator = cast("PagedTokenToKVPoolAllocator", params.token_to_kv_pool_allocator)  # checked: paged
        super().__init__(params)
        self.settings = settings = settings or env.settings()
        self.mode = mode or settings.mode
        self.canonical_from = (modes.canonical_from(self.mode, settings.recompute_blocks) if canonical_from == -1
                               else canonical_from)
        self.pages = PoolPages(allocator)
        self.refs = PageRefs(self.pages)
        self.ownership = ownership.register(allocator, self.refs)
        self.store = ChunkStore(self.refs, on_evict=self._demote)
        self.ledger = Ledger(self.refs, self.store)
        self.refs.on_change = self.ledger.touch
        self.refs.on_gone = self.ledger.gone
        self.store.on_change = self.ledger.chunk_changed
        self.kv_pool = params.token_to_kv_pool_allocator.get_kvcache()
        # Under TP the ranks agree on what the tiers give, over SGLang's TP CPU group (tiers/agreement.py).
        self.tiers = tiers or Tiers(self.kv_pool, self.page_size, settings.host_tier_gb,
                                    storage.from_settings(model_fingerprint, settings),
                                    Agreement.of_group(getattr(params, "tp_cache_group", None)))
        self.linker = Linker(settings.placement, self.page_size, model_fingerprint)
        self.compile_rows = compile_rows.CompileRows(self.page_size)
        private_loads = settings.chunk_store == "host" and modes.copies_private_prefix(self.mode)
        self.residency = Residency(self.store, self.refs, self.pages, self.tiers, self.evict, self.page_size,
                                   self.canonical_from, self.compile_rows.in_flight if self.mode.shares else None,
                                   private_loads, modes.epic_lead_pages(self.mode, self.page_size))
        # The parts, each handed only what it reads.
        self.readiness = Readiness(rows=self.compile_rows, store=self.store, tiers=self.tiers,
                                   shares=self.mode.shares, keeps=self.residency.keeps,
                                   canonical_slots=self.residency.canonical_slots)
        self.readers = Readers(rows=self.compile_rows, pages=self.pages, refs=self.refs,
                               page_size=self.page_size, canonical_from=self.canonical_from)
        self.report = CacheReport(pages=self.pages, refs=self.refs, ledger=self.ledger, store=self.store,
                               compile_rows=self.compile_rows, tiers=self.tiers, mode=self.mode,
                               page_size=self.page_size, reuse_refused=settings.reuse_refused)
        self.admission = Admission(pages=self.pages, refs=self.refs, store=self.store, tiers=self.tiers,
                                   kv_pool=self.kv_pool, evict=self.evict, counters=self.report.counters,
                                   mode=self.mode, canonical_from=self.canonical_from, page_size=self.page_size)

    # ---- the request side -------------------------------------------------

    def _plan(self, req: Req, link: Link, params: MatchPrefixParams) -> None:
        """Pin and load the request's chunks, plan it, and put its ids in planned order."""
        if self.residency.private_loads:  # its earlier loads are its own pages: free them before loading again
            self.residency.let_go(link)
        found = self.residency.find(link.shape, self._pin_budget(req, link))
        self.residency.hold(link, found)
        # Input logprobs from a slot on: as SGLang limits its prefix there, chunks past it are computed.
        start = req.logprob_start_len if getattr(req, "return_logprob", False) and req.logprob_start_len >= 0 else None
        self._compile_absent(req, link, found, start)
        # A compile of a stored chunk would compute its first block; when the tree holds the
        # chunk's earlier compile whole in natural order, that order costs nothing.
        holds_natural = link.compile and bool(found.resident) and self._holds_compile(link, params)
        made_from = (found.resident, start, holds_natural)  # with the cache's mode and layout: all plan() reads
        link.set_planned(link.reuse_plan(made_from) or planner.plan(link.shape, found.resident, self.mode, self.page_size,
                                                                    self.canonical_from, start, holds_natural), made_from)
        planned = cast(planner.Planned, link.planned)  # just set
        if planned.reuses:
            # Same length, new order: fill_ids is rebuilt from it below (it would go stale).
            req.origin_input_ids[:] = link.shape.ids_in(planned.slot_index)
        else:
            req.origin_input_ids[:] = link.natural
        req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids

    def _pin_budget(self, req: Req, link: Link) -> int | None:
        """Pages the request may pin for its chunks; None: no limit. Where it holds them beside
        slots for its whole prompt (modes.holds_chunks_beside_prompt), the pool must fit both, as
        SGLang counts them when it admits it: its prompt, what it may generate, a page for
        alignment; or it waits for room no one can give."""
        total = getattr(self.pages.allocator, "size", None)
        if not modes.holds_chunks_beside_prompt(self.mode) or total is None or self.residency.private_loads:
            return None  # a private load's pages are its prompt's own: what fits the prompt fits them
        params = req.sampling_params
        generated = len(req.output_ids)
        max_new = cast(int, params.max_new_tokens)  # the scheduler has set it (init_req_max_new_tokens)
        to_come = min(max(max_new - generated, 0), CLIP_MAX_NEW_TOKENS)
        return total // self.page_size - -(-(link.size + generated + to_come) // self.page_size) - 1

    def _compile_absent(self, req: Req, link: Link, found: Found, logprob_start: int | None) -> None:
        """Chunks of the request that no tier holds are computed by compile rows (compile_rows.py).

        In the modes that read stored pages in place, the request is planned with the chunk's
        pages as placeholders and reads them in the forward its compile rows run in. EPIC and
        CacheBlend copy stored KV before their forward, so they wait for it to be stored.
        """
        link.compiling, link.wait = {}, False
        if link.compile or not self.mode.reuses:
            return
        rows = self.compile_rows
        for i, ((start, end), key) in enumerate(zip(link.chunk_slots, link.keys)):
            if key in found.resident or key in link.compiling or key in found.left_out \
                    or not self.residency.keeps(start, end):
                continue
            if logprob_start is not None and end > logprob_start:
                continue  # computed in context whatever the store holds (planner.plan)
            if self.residency.private_loads and key in link.made_for:
                continue  # made for it once, not loadable now (host LRU, no room): in context, never waited on twice
            row = rows.for_chunk(req, link.shape, i)
            if row is None:
                continue
            link.compiling[key] = row
            if self.mode.shares:
                pages = (end - start) // self.page_size - cast(int, self.canonical_from)  # it keeps(): an int
                found.resident[key] = (compile_rows.PLACEHOLDER_PAGE,) * pages
            else:
                link.wait = True

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        req = params.req
        link = self.linker.link(req) if req is not None else None
        if link is None:
            return super().match_prefix(params)
        req = cast("Req", req)  # linked: a request
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
        planned = cast(planner.Planned, link.planned)  # _plan set it
        if not planned.reuses:
            return result
        plan = cast("Plan", planned.plan)  # it reuses: a plan
        limit = len(ids) if key.limit is None else min(key.limit, len(ids))
        end = min(plan.prefix_slots, limit // self.page_size * self.page_size)
        if end <= result.device_prefix_len:
            return result
        # A copy: the readers point it at their compile rows in place (readers.py), and the plan is kept for a rematch.
        link.injected = planned.reused_slots[result.device_prefix_len:end].to(self.pages.allocator.device, copy=True)
        return result._replace(device_prefix_len=end)

    def _match_unplanned(self, link: Link, params: MatchPrefixParams) -> MatchResult:
        """The match that sorts the waiting queue (lpm and the other cache-aware policies): what
        the tree holds for the request in natural order, with no plan, no chunk held and nothing
        loaded from the tiers. Planning it would pin its chunks until the round ends, and the
        request at the head, whose budget is checked after, would see them as unevictable."""
        # With the output so far of a request retracted to the queue.
        return self._match_natural(link, params, params.key.token_ids[link.size:])

    def _match_natural(self, link: Link, params: MatchPrefixParams, output: Iterable[int] = ()) -> MatchResult:
        """What the tree holds for the request in natural slot order (pads as PAD_ID), unplanned."""
        key = params.key
        ids = link.shape.pad_masked[:]
        ids.extend(output)
        natural = RadixKey(ids, key.extra_key, is_bigram=key.is_bigram, limit=key.limit, cache_salt=key.cache_salt)
        return super().match_prefix(dataclasses.replace(params, key=natural))

    def _holds_compile(self, link: Link, params: MatchPrefixParams) -> bool:
        """Whether the tree still holds this compile request, in natural order, through its chunk."""
        return self._match_natural(link, params).device_prefix_len >= link.chunk_slots[0][1]

    def _demote(self, key: str, pages: tuple[int, ...]) -> None:
        self.tiers.demote(key, self.pages.slots(pages))

    def prefix_device_indices(self, req: Req) -> torch.Tensor:
        link = link_of(req)
        path = self.path_device_indices(req.last_node)
        if link is not None and link.injected is not None:
            path = torch.cat([path[:link.tree_len], link.injected.to(path.device, path.dtype)])
        assert len(path) >= req.prefix_len, (req.rid, len(path), req.prefix_len)
        return path[:req.prefix_len]

    def _insert_cache(self, req: Req, token_ids: Sequence[int], **kwargs: Any) -> tuple[RadixKey, torch.Tensor, int]:
        link = link_of(req)
        if link is None:
            return super()._insert_cache(req, token_ids, **kwargs)
        key, kv_indices, existing = super()._insert_cache(req, link.masked(token_ids), **kwargs)
        if link.injected is not None:
            # New tree nodes over injected pages hold them from now on: give them a reference.
            start = max(existing, link.tree_len + link.tree_took)
            end = min(len(key), link.tree_len + len(link.injected))
            if end > start:
                self.refs.acquire(self.pages.pages_of(kv_indices[start:end]))
                link.tree_took = end - link.tree_len
        return key, kv_indices, existing

    def on_release(self, req: Req, *, checkpointed: bool) -> None:
        link = link_of(req)
        if link is not None:
            if link.compile and checkpointed:
                self._publish(req, link)
            if link.compile:
                self.compile_rows.released(req, link.keys[0])
            self.residency.let_go(link)
            link.release()
        super().on_release(req, checkpointed=checkpointed)

    def _publish(self, req: Req, link: Link) -> None:
        """A compiled chunk's pages (now owned by the tree) join the store."""
        (start, end), key = link.chunk_slots[0], link.keys[0]
        if not self.residency.keeps(start, end) or req.kv.cache_protected_len < end or key in self.store:
            return
        canonical_from = cast(int, self.canonical_from)  # it keeps(): an int
        canonical = tuple(self.pages.pages_of(compile_rows.canonical_slots(
            req, self.req_to_token_pool.req_to_token, self.page_size, canonical_from)))
        self.store.put(key, canonical)
        self.tiers.persist(key, self.pages.slots(canonical))
        self.report.counters.compiled_chunks += 1
        # A host-tier store (--mepic-chunk-store host) keeps it in host memory only; the tree still holds the
        # compile's pages, evictable. Where the host cannot take it, the pool's store keeps it.
        if self.residency.private_loads and self.tiers.demote(key, self.pages.slots(canonical)):
            self.store.remove(key, evicted=False)

    # ---- tree nodes, as the ledger sees them ----------------------------------
    # Unlocked nodes hold their pages loosely (evictable); locking one pins them.

    def _node_pages(self, node: TreeNode) -> list[int]:
        pages = getattr(node, "pages", None)
        if pages is None:  # kept on the node: lock, unlock and evict read it again
            # Why the ignore: an attribute of this cache's own on SGLang's TreeNode (unused while mypy reads no SGLang).
            pages = node.pages = self.pages.pages_of(node.value)  # type: ignore[attr-defined, unused-ignore]
        return pages

    def _insert_helper(self, node: TreeNode, key: RadixKey, value: torch.Tensor, priority: int = 0,
                       inserted_len: int = 0) -> tuple[int, TreeNode]:
        matched, last = super()._insert_helper(node, key, value, priority, inserted_len)
        if matched < len(key):  # a new leaf, unlocked, over the rest of the key
            self.ledger.nodes_hold(self._node_pages(last))
        return matched, last

    def _update_leaf_status(self, node: TreeNode) -> None:
        was = node in self.evictable_leaves
        super()._update_leaf_status(node)
        if not was and node in self.evictable_leaves:
            self.leaves.became_evictable(node)

    def _split_node(self, key: RadixKey, child: TreeNode, split_len: int) -> TreeNode:
        pages = self._node_pages(child)
        parent = super()._split_node(key, child, split_len)
        cut = split_len // self.page_size
        parent.pages, child.pages = pages[:cut], pages[cut:]  # type: ignore[attr-defined, unused-ignore]  # as _node_pages
        return parent

    def _delete_leaf(self, node: TreeNode) -> None:  # only `evict` deletes leaves
        self.ledger.nodes_let_go(self._node_pages(node))
        super()._delete_leaf(node)

    def inc_lock_ref(self, node: TreeNode) -> IncLockRefResult:
        n = node
        while n is not None and n is not self.root_node:
            if n.lock_ref == 0:
                self.ledger.nodes_let_go(self._node_pages(n))
            n = n.parent
        return super().inc_lock_ref(node)

    def dec_lock_ref(self, node: TreeNode, params: DecLockRefParams | None = None) -> DecLockRefResult:
        n = node
        while n is not None and n is not self.root_node:
            if n.lock_ref == 1:
                self.ledger.nodes_hold(self._node_pages(n))
            n = n.parent
        return super().dec_lock_ref(node, params)

    # ---- memory -----------------------------------------------------------

    def evictable_size(self) -> int:
        # SGLang's tree count would count a page shared by nodes and the store once per holder.
        return self.ledger.freeable() * self.page_size

    def evict(self, params: EvictParams) -> EvictResult:
        """Evict tree leaves (SGLang's heap, least recently used first), then unheld chunks (LRU),
        until `num_tokens` slots are freed.

        SGLang's own loop stops when the nodes it dropped add up to the request, but a node's
        page that the store or another node also holds frees nothing; so this is its loop, stopped
        by the pages actually freed (`PageRefs.freed` moves at once, inside a free group too),
        over the leaves in SGLang's order (leaves.py).
        """
        if self.disable:
            return EvictResult()
        start_time, start = time.perf_counter(), self.refs.freed
        want = -(-params.num_tokens // self.page_size)
        last = []  # returned to the allocator together, after the walk
        leaves = self.leaves.in_order()
        while self.refs.freed - start < want and (node := next(leaves, None)) is not None:
            pages = self._node_pages(node)
            self._delete_leaf(node)  # tells the ledger; its parent, now a leaf, is pushed
            last += self.refs.releasable(pages)  # after: the ledger settles the pages it frees at once
            cast("KVCacheEventRecorder", self.kv_events).record_remove(node)  # RadixCache always makes one
        if last:
            self.pages.free(last)
        short = want - (self.refs.freed - start)
        if short > 0:  # the unlocked tree is gone: chunks with no pinned page free what they hold
            self.store.evict(short, loose=self.ledger.chunk_loose)
        self.ledger.settle()  # the pages still held that it touched: its cost, not the next caller's
        evicted = (self.refs.freed - start) * self.page_size
        self.update_eviction_metrics(evicted, start_time)
        return EvictResult(num_tokens_evicted=evicted)

    def reset(self) -> None:
        # SGLang clears the allocator right after resetting the tree (flush_cache), so
        # the store and the counts are dropped, not released page by page.
        self.leaves = Leaves(self)  # before SGLang's reset, which makes the root
        super().reset()
        if getattr(self, "store", None) is not None:
            self.store.forget()
            self.refs.forget()
            self.ledger.clear()
            self.tiers.clear_host()
            self.residency.reset()
            self.compile_rows.reset()
            self.report.reset()


def mepic_cache(holder: object) -> MepicRadixCache | None:
    """The MEPIC cache of a scheduler, batch, prefill adder or schedule policy (whatever holds SGLang's
    `tree_cache`); None where it runs another cache (SGLang's own: no chunk is reused)."""
    tree = getattr(holder, "tree_cache", None)
    return tree if isinstance(tree, MepicRadixCache) else None
