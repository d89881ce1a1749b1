"""Chunk hash -> canonical pages, with object-level LRU eviction.

The store holds one page reference per canonical page of every chunk it keeps
(two chunks that start alike share pages, one reference each), and evicts least
recently used chunks that nothing but stored chunks holds. The other holders,
and when a page is freed: docs/design.md, Ownership.
"""

from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Callable

from sglang_mepic.pages.refs import PageRefs


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
    # told when a chunk joins (True) or leaves (False), after the store has changed (a leaving
    # chunk's pages are released after: the holders hear of the pages freed last)
    on_change: Callable[[str, tuple[int, ...], bool], None] | None = None
    stats: Stats = field(default_factory=Stats)
    _chunks: "OrderedDict[str, Chunk]" = field(default_factory=OrderedDict)  # oldest use first
    _keys: dict[int, list[str]] = field(default_factory=dict)  # page -> keys of the stored chunks that hold it
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

    def held_pages(self) -> list[int]:
        """Every page a stored chunk holds, once."""
        return list(self._keys)

    def page_keys(self) -> dict[int, list[str]]:
        """Page -> keys of the stored chunks that hold it: the store's own map, to read, not to change
        (the ledger reads it per page)."""
        return self._keys

    def keys_of(self, page: int) -> list[str]:
        """Keys of the stored chunks that hold `page`."""
        return self._keys.get(page, [])

    def loose(self, chunk: Chunk) -> bool:
        """Whether only stored chunks hold the chunk's pages (the default test of `evict`)."""
        return all(self.refs.count(p) == self.holding(p) for p in chunk.pages)

    def _evictable(self, loose: Callable[[Chunk], bool] | None = None) -> Iterator[Chunk]:
        """Chunks that may be evicted, least recently used first."""
        loose = loose or self.loose
        return (c for c in self._chunks.values() if loose(c))

    def evict(self, num_pages: int, loose: Callable[[Chunk], bool] | None = None) -> int:
        """Evict least recently used chunks that `loose` allows (default: those only stored chunks
        hold) until `num_pages` pages are freed; returns the pages freed.

        The walk stops as soon as the chunks it found could free enough, so its work follows
        what it frees (plus the held chunks it steps over), not the size of the store.
        """
        freed = 0
        while freed < num_pages:
            batch, bound = [], freed
            for chunk in self._evictable(loose):
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

    def remove(self, key: str, *, evicted: bool = True) -> int:
        """Evict one chunk now; returns the pages freed (those no one else held). Not `evicted`: its KV is
        kept below already (a host-tier store hands each chunk down as it is compiled): no demotion, no count."""
        chunk = self._chunks.pop(key)
        for p in chunk.pages:
            keys = self._keys[p]
            keys.remove(key)
            if not keys:
                del self._keys[p]
        self._pages -= len(chunk.pages)
        if self.on_evict is not None and evicted:
            self.on_evict(chunk.key, chunk.pages)
        if self.on_change is not None:  # before the release, which tells of the pages it frees after it
            self.on_change(chunk.key, chunk.pages, False)
        freed = len(self.refs.release(chunk.pages))
        self.stats.evictions += evicted
        return freed

    def forget(self) -> None:
        """Drop every chunk without releasing pages (the pool is being cleared wholesale)."""
        self._chunks.clear()
        self._keys.clear()
        self._pages = 0

    def canonical_pages(self) -> int:
        return self._pages
