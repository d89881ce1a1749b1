"""Property tests of page ownership: chunk store, radix nodes and running requests
sharing refcounted pages, under random admit / reuse / release / evict / flush."""

import os
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sglang_mepic.chunk_store import ChunkStore
from sglang_mepic.pages import FreeList, PageError, PageRefs

NUM_PAGES = 48
CHUNK_PAGES = {f"c{i}": 2 + i % 4 for i in range(8)}  # chunk -> pages incl. its first block


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
            if free + self.store.evictable_pages(keep=set(chunks)) < need:
                self.refused += 1
                return
            self.store.evict(need - free, keep=set(chunks))
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
        self.store.flush()
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
        self.store.flush()
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
    assert store.evictable_pages() == 2  # "c"; "a" is in use
    assert store.evict(8) == 2 and "a" in store
    refs.release(held)
    assert store.flush() == 2 and refs.allocator.available() == 8
