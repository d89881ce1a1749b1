"""Chunk hash -> canonical pages, with object-level LRU eviction.

The store holds one page reference per canonical page of every chunk it keeps.
Requests and radix nodes that use those pages hold references of their own
(see `pages.PageRefs`). Two stored chunks may share pages: a chunk that starts
like another (a common header, a longer version of a document) is compiled over
the other's compile path in the radix tree, so their first pages are one
physical copy with one reference per chunk. A chunk is evictable exactly when
only stored chunks still hold its pages: nothing running reads it, and evicting
it and the chunks it shares pages with frees every page.
Admission is SGLang's (its scheduler admits a request when free pages plus
evictable ones suffice); the mepic radix cache counts unheld chunks as
evictable and evicts them after the tree's leaves.
"""

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Collection

from sglang_mepic.pages import PageRefs


@dataclass
class Chunk:
    key: str
    pages: tuple[int, ...]


@dataclass
class Stats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0


@dataclass
class ChunkStore:
    refs: PageRefs
    on_evict: Callable[[str, tuple[int, ...]], None] | None = None  # called while the pages still hold the KV
    # told when a chunk joins (True) or leaves (False), after the store has changed
    on_change: Callable[[str, tuple[int, ...], bool], None] | None = None
    stats: Stats = field(default_factory=Stats)
    _chunks: "OrderedDict[str, Chunk]" = field(default_factory=OrderedDict)  # oldest use first
    _keys: dict = field(default_factory=dict)  # page -> keys of the stored chunks that hold it
    _pages: int = 0  # canonical pages over all chunks (a shared page once per chunk)

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: str) -> bool:
        return key in self._chunks

    def lookup(self, key: str) -> tuple[int, ...] | None:
        """The canonical pages of `key` (None on a miss); a hit makes it most recently used.

        The caller acquires a reference on each page it goes on to use.
        """
        chunk = self._chunks.get(key)
        if chunk is None:
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self._chunks.move_to_end(key)
        return chunk.pages

    def peek(self, key: str) -> tuple[int, ...] | None:
        """The canonical pages of `key`, without counting a hit or touching the LRU order."""
        chunk = self._chunks.get(key)
        return None if chunk is None else chunk.pages

    def chunks(self) -> list[tuple[int, ...]]:
        """The canonical pages of every stored chunk."""
        return [c.pages for c in self._chunks.values()]

    def put(self, key: str, pages: tuple[int, ...]) -> tuple[int, ...]:
        """Keep `pages` as the canonical pages of `key`; the caller keeps its own reference.

        If `key` is already stored (two requests compiled the same chunk at once),
        the stored pages win and are returned; the caller should use them and drop its copy.
        """
        if key in self._chunks:
            self._chunks.move_to_end(key)
            return self._chunks[key].pages
        pages = tuple(pages)
        self._chunks[key] = Chunk(key, pages)
        for p in pages:
            self._keys.setdefault(p, []).append(key)
        self._pages += len(pages)
        self.refs.acquire(pages)
        if self.on_change is not None:
            self.on_change(key, pages, True)
        return pages

    def holding(self, page: int) -> int:
        """Stored chunks that hold `page`."""
        return len(self._keys.get(page, ()))

    def keys_of(self, page: int) -> list[str]:
        """Keys of the stored chunks that hold `page`."""
        return self._keys.get(page, [])

    def loose(self, chunk: Chunk) -> bool:
        """Whether only stored chunks hold the chunk's pages (the default test of `evict`)."""
        return all(self.refs.count(p) == self.holding(p) for p in chunk.pages)

    def _evictable(self, keep: Collection[str] = (), loose: Callable[[Chunk], bool] | None = None):
        """Chunks that may be evicted, least recently used first."""
        loose = loose or self.loose
        return (c for c in self._chunks.values() if c.key not in keep and loose(c))

    def evictable_pages(self, keep: Collection[str] = ()) -> int:
        """Pages that evicting every evictable chunk (but those in `keep`) would free: a page
        shared with a chunk that stays is not freed."""
        held = Counter(p for c in self._evictable(keep) for p in c.pages)
        return sum(1 for p, n in held.items() if n == self.holding(p))

    def evict(self, num_pages: int, keep: Collection[str] = (),
              loose: Callable[[Chunk], bool] | None = None) -> int:
        """Evict least recently used chunks that `loose` allows (default: those only stored chunks
        hold), not those in `keep`, until `num_pages` pages are freed; returns the pages freed.

        The walk stops as soon as the chunks it found could free enough, so its work follows
        what it frees (plus the held chunks it steps over), not the size of the store.
        """
        freed = 0
        while freed < num_pages:
            batch, bound = [], freed
            for chunk in self._evictable(keep, loose):
                batch.append(chunk.key)
                bound += len(chunk.pages)
                if bound >= num_pages:
                    break
            if not batch:
                break
            for key in batch:  # a page shared with a chunk that stays frees nothing: walk again
                if freed >= num_pages:
                    break
                freed += self.remove(key)
        return freed

    def remove(self, key: str) -> int:
        """Evict one chunk now; returns the pages freed (those no one else held)."""
        chunk = self._chunks.pop(key)
        for p in chunk.pages:
            keys = self._keys[p]
            keys.remove(key)
            if not keys:
                del self._keys[p]
        self._pages -= len(chunk.pages)
        if self.on_evict is not None:
            self.on_evict(chunk.key, chunk.pages)
        freed = len(self.refs.release(chunk.pages))
        if self.on_change is not None:
            self.on_change(chunk.key, chunk.pages, False)
        self.stats.evictions += 1
        return freed

    def forget(self) -> None:
        """Drop every chunk without releasing pages (the pool is being cleared wholesale)."""
        self._chunks.clear()
        self._keys.clear()
        self._pages = 0

    def flush(self) -> int:
        """Evict every evictable chunk; returns the pages freed."""
        return self.evict(len(self._keys) + 1)

    def canonical_pages(self) -> int:
        return self._pages
