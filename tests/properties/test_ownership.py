"""Property tests of page ownership (docs/design.md, Ownership): chunk store, radix nodes and
running requests sharing refcounted pages, under random admit / reuse / release / evict / flush;
and the same counts kept through SGLang's own allocator and its patched frees."""

import gc
import os
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_mepic.pages import ownership
from sglang_mepic.pages.chunk_store import ChunkStore
from sglang_mepic.pages.refs import FreeList, PageError, PageRefs

NUM_PAGES = 48
CHUNK_PAGES = {f"c{i}": 2 + i % 4 for i in range(8)}  # chunk -> pages incl. its first block


def evictable_pages(store: ChunkStore, keep=()) -> int:
    """Pages that evicting every evictable chunk (but those in `keep`) would free: a page
    shared with a chunk that stays is not freed."""
    held = Counter(p for c in store._chunks.values() if c.key not in keep and store.loose(c) for p in c.pages)
    return sum(1 for p, n in held.items() if n == store.holding(p))


def evict_keeping(store: ChunkStore, num_pages: int, keep) -> int:
    return store.evict(num_pages, loose=lambda c: c.key not in keep and store.loose(c))


def flush(store: ChunkStore) -> int:
    """Evict every evictable chunk; returns the pages freed."""
    return store.evict(store.canonical_pages() + 1)  # more than the store could ever free


class Ownership(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.allocator = FreeList(NUM_PAGES)
        self.refs = PageRefs(self.allocator)
        self.store = ChunkStore(self.refs)
        self.requests: dict[int, list[int]] = {}
        self.nodes: list[list[int]] = []
        self.next_rid = 0
        self.refused = 0

    def holders(self) -> Counter:
        held = Counter()
        for pages in self.requests.values():
            held.update(pages)
        for pages in self.nodes:
            held.update(pages)
        for chunk in self.store._chunks.values():
            held.update(chunk.pages)
        return held

    @rule(chunks=st.lists(st.sampled_from(sorted(CHUNK_PAGES)), min_size=1, max_size=4),
          prompt_pages=st.integers(1, 3))
    def admit(self, chunks, prompt_pages):
        need = prompt_pages + sum(CHUNK_PAGES[c] if c not in self.store else 1 for c in chunks)
        free = self.allocator.available()
        if free < need:  # as the scheduler does: evict unheld chunks (not this request's) if that suffices
            if free + evictable_pages(self.store, keep=set(chunks)) < need:
                self.refused += 1
                return
            evict_keeping(self.store, need - free, keep=set(chunks))
        pages = self.refs.alloc(prompt_pages)
        for key in chunks:
            first = self.refs.alloc(1)
            shared = self.store.lookup(key)
            if shared is not None:
                self.refs.acquire(shared)
            else:
                compiled = self.refs.alloc(CHUNK_PAGES[key] - 1)
                shared = self.store.put(key, tuple(compiled))
                assert shared == tuple(compiled)
            pages += first + list(shared)
        self.requests[self.next_rid] = pages
        self.next_rid += 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), cache_in_tree=st.booleans())
    def release(self, data, cache_in_tree):
        rid = data.draw(st.sampled_from(sorted(self.requests)))
        pages = self.requests.pop(rid)
        if cache_in_tree:
            self.refs.acquire(pages)
            self.nodes.append(pages)
        self.refs.release(pages)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def evict_node(self, data):
        i = data.draw(st.integers(0, len(self.nodes) - 1))
        self.refs.release(self.nodes.pop(i))

    @rule(n=st.integers(0, NUM_PAGES))
    def evict_chunks(self, n):
        before = self.allocator.available()
        freed = self.store.evict(n)
        assert freed == self.allocator.available() - before

    @rule()
    def flush(self):
        while self.nodes:
            self.refs.release(self.nodes.pop())
        flush(self.store)
        if not self.requests:
            assert self.allocator.available() == NUM_PAGES
            assert len(self.store) == 0

    @invariant()
    def counts_match_holders(self):
        held = self.holders()
        assert {p: self.refs.count(p) for p in held} == dict(held)
        assert self.refs.shared() == sum(1 for n in held.values() if n > 1)
        assert self.allocator.available() + len(held) == NUM_PAGES

    def teardown(self):
        for pages in self.requests.values():
            self.refs.release(pages)
        for pages in self.nodes:
            self.refs.release(pages)
        flush(self.store)
        assert self.allocator.available() == NUM_PAGES


TestOwnership = Ownership.TestCase
TestOwnership.settings = settings(max_examples=int(os.environ.get("OWNERSHIP_EXAMPLES", 150)),
                                  stateful_step_count=40, deadline=None)


def test_double_release_is_caught():
    refs = PageRefs(FreeList(4))
    pages = refs.alloc(2)
    refs.release(pages)
    with pytest.raises(PageError):
        refs.release(pages)


def test_evicted_chunk_is_lru_and_never_in_use():
    refs = PageRefs(FreeList(8))
    store = ChunkStore(refs)
    for key in ("a", "b", "c"):
        pages = refs.alloc(2)
        store.put(key, tuple(pages))
        refs.release(pages)  # the compiling request is done
    held = store.lookup("a")  # a running request holds "a"; "b" is now least recently used
    refs.acquire(held)
    assert store.evict(2) == 2  # evicting "b" alone frees enough
    assert "a" in store and "b" not in store and "c" in store
    assert evictable_pages(store) == 2  # "c"; "a" is in use
    assert store.evict(8) == 2 and "a" in store
    refs.release(held)
    assert flush(store) == 2 and refs.allocator.available() == 8


# ---- through SGLang's allocator ---------------------------------------------------------------

POOL_PAGES = 24
PAGE = 4


def sglang_allocator(num_pages: int = POOL_PAGES):
    """SGLang's paged allocator over a small CPU pool, its frees patched (pages 1..num_pages)."""
    import torch
    from support.replay import apply_hooks
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    apply_hooks()
    kv = MHATokenToKVPool(num_pages * PAGE, PAGE, torch.float32, 1, 1, 1, "cpu", False, start_layer=0, end_layer=1)
    return PagedTokenToKVPoolAllocator(num_pages * PAGE, PAGE, torch.float32, "cpu", kv, False)


class AllocatorOwnership(RuleBasedStateMachine):
    """Holders taken by the cache (`PageRefs`) and dropped by SGLang's frees (`free_page_ids`, `free`,
    inside free groups or not) or by the cache's own release: the counts follow the holders, a held
    page is never on the free list, and the pool balances."""

    def __init__(self):
        super().__init__()
        import torch

        from sglang_mepic.pages.pool_pages import PoolPages

        self.torch = torch
        self.allocator = sglang_allocator()
        self.refs = PageRefs(PoolPages(self.allocator))
        self.owner = ownership.register(self.allocator, self.refs)
        self.holdings: list[list[int]] = []  # one entry per holder: the pages it holds
        self.pending: list[int] = []         # last holder gone inside a free group: freed at its end
        self.last_freed = 0                  # pages whose last holder let go, as the model counts

    def held(self) -> Counter:
        held = Counter()
        for pages in self.holdings:
            held.update(pages)
        return held

    def _gone(self, pages: list[int]) -> None:
        """The model's side of one holder letting go of `pages`."""
        still = self.held()
        last = [p for p in pages if still[p] == 0]
        self.last_freed += len(last)
        if self.allocator.free_group is not None:
            self.pending += last

    def _take(self, data) -> list[int]:
        return self.holdings.pop(data.draw(st.integers(0, len(self.holdings) - 1)))

    @rule(n=st.integers(1, 4))
    def alloc(self, n):
        pages = self.refs.alloc(n)
        if pages is None:
            assert self.allocator.available_size() < n * PAGE
            return
        assert not set(pages) & set(self.held()) and not set(pages) & set(self.pending)
        self.holdings.append(pages)

    @precondition(lambda self: self.holdings)
    @rule(data=st.data())
    def acquire(self, data):
        pages = data.draw(st.sampled_from(self.holdings))
        self.refs.acquire(pages)
        self.holdings.append(list(pages))

    @precondition(lambda self: self.holdings)
    @rule(data=st.data())
    def free_page_ids(self, data):
        pages = self._take(data)
        self.allocator.free_page_ids(self.torch.tensor(pages, dtype=self.torch.int64))
        self._gone(pages)

    @precondition(lambda self: self.holdings)
    @rule(data=st.data(), every_slot=st.booleans())
    def free_slots(self, data, every_slot):
        pages = self._take(data)
        page = self.torch.tensor(pages, dtype=self.torch.int64)[:, None]
        slots = page * PAGE + (self.torch.arange(PAGE) if every_slot else self.torch.tensor([PAGE - 1]))
        self.allocator.free(slots.reshape(-1))
        self._gone(pages)

    @precondition(lambda self: self.holdings)
    @rule(data=st.data())
    def cache_releases(self, data):
        pages = self._take(data)
        self.refs.release(pages)
        self._gone(pages)

    @precondition(lambda self: self.allocator.free_group is None)
    @rule()
    def group_begins(self):
        self.allocator.free_group_begin()

    @precondition(lambda self: self.allocator.free_group is not None)
    @rule()
    def group_ends(self):
        self.allocator.free_group_end()
        self.pending = []

    @invariant()
    def counts_follow_holders(self):
        held = self.held()
        assert {p: self.refs.count(p) for p in held} == dict(held)
        assert self.refs.shared() == sum(1 for n in held.values() if n > 1)
        assert self.refs.freed == self.last_freed

    @invariant()
    def held_pages_are_never_free(self):
        free = self.allocator.get_all_free_pages().tolist()
        assert len(free) == len(set(free))
        assert not set(free) & set(self.held())
        assert len(free) + len(self.held()) + len(self.pending) == POOL_PAGES

    def teardown(self):
        if self.allocator.free_group is not None:
            self.group_ends()
        while self.holdings:
            pages = self.holdings.pop()
            self.refs.release(pages)
        assert self.allocator.available_size() == POOL_PAGES * PAGE


TestAllocatorOwnership = AllocatorOwnership.TestCase
TestAllocatorOwnership.settings = settings(max_examples=int(os.environ.get("OWNERSHIP_EXAMPLES", 150)),
                                           stateful_step_count=40, deadline=None)


def test_an_allocator_nobody_owns_frees_as_sglang_does():
    import torch

    allocator = sglang_allocator(4)
    pages = PageRefs(FreeList(1))  # counts of another pool: never consulted for this allocator
    owner = ownership.register(allocator, pages)
    assert ownership.owner_of(allocator) is owner
    del owner
    gc.collect()
    assert ownership.owner_of(allocator) is None  # the registration went with its ownership (its cache)
    slots = allocator.alloc(2 * PAGE)
    allocator.free(slots)
    assert allocator.available_size() == 4 * PAGE and pages.freed == 0
