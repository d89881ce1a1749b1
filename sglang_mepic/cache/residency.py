"""Where a request's chunks are when it is planned, and the pins that keep them there.

Before the planner runs, each chunk of the request is looked up in the chunk
store. Chunks the device pool holds are pinned first, all of them, and only
then are missing ones loaded from the tiers below (tiers/levels.py): a load may evict
for room, and must never evict a chunk this request is about to read.

Storage is never read on the scheduler thread. While a request waits, its
missing chunks' entries are read in the background (readiness.py, prefetch.py);
the request is held back until none is pending, then planned, and a load only
copies what was fetched into the pages it allocates.

A request may be given a budget of pages it may pin. CacheBlend's request holds
the stored pages of its chunks until its own slots, allocated whole for its
prompt, have their copy: it needs its prompt and its chunks at once, and one
whose chunks were all stored could need more than the pool and wait for ever.
Chunks beyond the budget are left out: the request computes them.

The pins are the request's from the moment it is planned (`hold`). Here they stay
in custody until the request is admitted (admission.py, which then keeps them
until its release) or the round ends without it (`end_round`): the scheduler's
memory check, which follows the match, must not count them as evictable, and
chunks wanted only by waiting requests must not fill the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

from sglang.srt.mem_cache.base_prefix_cache import EvictParams, EvictResult

from sglang_mepic.cache.compile_rows import PLACEHOLDER_PAGE
from sglang_mepic.cache.link import Link
from sglang_mepic.cache.shape import Shape
from sglang_mepic.pages.chunk_store import ChunkStore
from sglang_mepic.pages.pool_pages import PoolPages
from sglang_mepic.pages.refs import PageRefs
from sglang_mepic.tiers.levels import Tiers


@dataclass
class Found:
    resident: dict[str, tuple[int, ...]]  # chunk key -> canonical pages on the device, pinned
    where: list[str]                      # per chunk segment: device, host, storage or absent
    pins: list[int]                       # pages pinned for the request (one reference each)
    left_out: set[str] = field(default_factory=set)  # chunks neither pinned nor loaded for the budget: computed
    private: bool = False                 # every pin is the request's own (loaded from the host for it alone)


class Residency:
    """private_loads: chunks loaded from the tiers become pages of the request's own, not stored ones
    (`--mepic-chunk-store host`: EPIC's copy is made as it loads, and the pool holds no store beside it).
    private_lead: with private_loads, the pages at the head of each chunk that the plan computes again in
    context (EPIC's first K tokens): they are neither loaded nor held, only the chunk's pages after them."""

    def __init__(self, store: ChunkStore, refs: PageRefs, pages: PoolPages, tiers: Tiers,
                 evict: Callable[[EvictParams], EvictResult], page_size: int, canonical_from: int | None,
                 in_flight: Callable[[str], tuple[int, ...] | None] | None = None, private_loads: bool = False,
                 private_lead: int = 0) -> None:
        self.store, self.refs, self.pages, self.tiers = store, refs, pages, tiers
        self.private_loads, self.private_lead = private_loads, private_lead if private_loads else 0
        # key -> canonical pages a compile row in a batch already launched writes (compile_rows.py), or None
        self.in_flight = in_flight
        self.evict = evict  # the cache's evict(EvictParams)
        self.page_size = page_size
        self.canonical_from = canonical_from
        self._planned: dict[int, Link] = {}  # planned in this round, holding their chunks

    def keeps(self, start: int, end: int) -> bool:
        """Whether the store keeps pages of a chunk over slots [start, end): not when every page
        of it is recomputed in context (`--mepic-recompute-blocks` at or above its page count)."""
        return self.canonical_from is not None and (end - start) // self.page_size > self.canonical_from

    def canonical_slots(self, start: int, end: int) -> int:
        """KV slots of a chunk's canonical pages (its pages after the ones computed in context)."""
        return end - start - cast(int, self.canonical_from) * self.page_size  # asked only where it keeps()

    def find(self, shape: Shape, budget: int | None = None) -> Found:
        """Pin the request's resident chunks, then load the missing ones the tiers have; at most
        `budget` pages pinned in all (None: no limit), in chunk order, the rest left out."""
        resident: dict[str, tuple[int, ...]] = {}
        pins: list[int] = []
        left_out: set[str] = set()
        where: list[str] = []
        stored = False  # a stored chunk is pinned: the request copies it at admission

        def fits(pages: int) -> bool:
            return budget is None or len(pins) + pages <= budget

        for key in shape.keys:
            pages = self.store.peek(key) if not self.private_loads else None  # a private load copies it (load)
            if pages is None and self.in_flight is not None and not shape.compile:
                pages = self.in_flight(key)
            if pages is not None and key not in resident:
                if not fits(len(pages)):
                    left_out.add(key)
                    where.append("absent")
                    continue
                self.refs.acquire(pages)
                resident[key] = pages
                pins += pages
                stored = True
            where.append("device" if pages is not None else "absent")
        for i, ((start, end), key) in enumerate(zip(shape.chunk_slots, shape.keys)):
            if where[i] != "absent" or key in left_out:
                continue
            if key in resident:  # loaded for an earlier segment of the same chunk
                where[i] = "device"
                continue
            if not self.keeps(start, end):
                continue
            num_pages = self.canonical_slots(start, end) // self.page_size
            lead = self.private_lead
            if not fits(num_pages - lead) or num_pages <= lead:  # nothing past the lead: computed in context
                left_out.add(key)
                continue
            pages, where[i] = self.load(key, num_pages)
            if pages is not None:
                if not self.private_loads:  # a private load's pages come with the request's reference
                    self.refs.acquire(pages)  # before the next load, which may evict
                # The plan reads only the pages past the lead; the lead's places are never read.
                resident[key] = (PLACEHOLDER_PAGE,) * lead + pages
                pins += pages
        return Found(resident, where, pins, left_out, self.private_loads and not stored and bool(pins))

    def load(self, key: str, num_pages: int) -> tuple[tuple[int, ...] | None, str]:
        """Copy a chunk from the host or storage tier into fresh device pages and store it; with
        `private_loads`, keep its pages past `private_lead` as the caller's (one reference), copied from
        the store's when the device store still keeps it (the host tier could not take it).

        Returns the pages and the tier it came from, or (None, "absent") when no tier has it
        sound or the pool has no room for it.
        """
        lead = self.private_lead
        if self.private_loads and key in self.store:
            copy = self._copy_stored(key, lead)
            return (copy, "device") if copy is not None else (None, "absent")
        if self.tiers.want(key, num_pages * self.page_size) not in ("host", "storage"):
            return None, "absent"  # or still being read: the request is computed without it
        pages = self._alloc(num_pages - lead)
        if pages is None:
            return None, "absent"
        try:
            # After the allocation: making room may have demoted chunks into the host tier, over this one.
            fetched = self.tiers.take(key, num_pages * self.page_size)
            if fetched is not None:
                kv, tier = fetched
                self.tiers.place((kv[:, :, lead * self.page_size:], tier), self.pages.slots(pages), key)
        except BaseException:
            self.refs.release(pages)
            raise
        if fetched is None:
            self.refs.release(pages)
            return None, "absent"
        if self.private_loads:
            return tuple(pages), fetched[1]  # the request's own: no one else matches them
        stored = self.store.put(key, tuple(pages))
        self.refs.release(stored)  # the store is now their only holder
        return stored, fetched[1]

    def _alloc(self, num_pages: int) -> list[int] | None:
        """Fresh pages, with one reference, making room by eviction if the pool is short."""
        pages = self.refs.alloc(num_pages)
        if pages is None:
            short = num_pages - self.pages.available()
            self.evict(EvictParams(num_tokens=short * self.page_size))
            pages = self.refs.alloc(num_pages)
        return pages

    def _copy_stored(self, key: str, lead: int) -> tuple[int, ...] | None:
        """A private copy of a chunk the device store keeps, its pages past `lead`, in fresh pages of the
        caller's; None when the pool has no room for it."""
        stored = cast(tuple[int, ...], self.store.lookup(key))[lead:]  # the caller checked it is stored
        self.refs.acquire(stored)  # not evicted for the copy's room
        try:
            pages = self._alloc(len(stored))
            if pages is not None:
                try:
                    self.tiers.device.move(self.pages.slots(pages), self.pages.slots(stored))
                except BaseException:
                    self.refs.release(pages)
                    raise
        finally:
            self.refs.release(stored)
        return tuple(pages) if pages is not None else None

    # ---- the pins a planned request holds ---------------------------------------

    def hold(self, link: Link, found: Found) -> None:
        """A request is planned (again): it holds the chunks `found` pinned for it instead of
        what an earlier plan pinned, until it is admitted or the round ends."""
        self.let_go(link)
        link.unplan()
        link.held = found.pins
        link.held_private = found.private
        link.found_where(found.where)
        if link.held:
            self._planned[id(link)] = link

    def let_go(self, link: Link) -> None:
        """Drop the pages the request holds (it is planned again, was not admitted, or ended)."""
        self._planned.pop(id(link), None)
        if link.held:
            self.refs.release(link.held)
            link.held = []
        link.held_private = False

    def end_round(self) -> None:
        """A scheduling round is over: requests planned in it but not admitted let go of their
        chunks; admitted ones keep theirs until their release."""
        for link in list(self._planned.values()):
            if link.admitted:
                del self._planned[id(link)]
            else:
                self.let_go(link)
                link.unplan()

    def reset(self) -> None:
        for link in self._planned.values():
            link.held = []
        self._planned.clear()
