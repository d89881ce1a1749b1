"""Chunk hash -> canonical pages, with object-level LRU eviction.

The store holds one page reference per canonical page of every chunk it keeps.
Requests and radix nodes that use those pages hold references of their own
(see `pages.PageRefs`), so a chunk is evictable exactly when the store is the
only holder left on all of its pages: evicting it then frees every page.
Admission is SGLang's (its scheduler admits a request when free pages plus
evictable ones suffice); the mepic radix cache counts unheld chunks as
evictable and evicts them after the tree's leaves.
"""

from collections import OrderedDict
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
    _chunks: "OrderedDict[str, Chunk]" = field(default_factory=OrderedDict)  # oldest use first
    stats: Stats = field(default_factory=Stats)
    on_evict: Callable[[str, tuple[int, ...]], None] | None = None  # called while the pages still hold the KV

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
        self.refs.acquire(pages)
        self._chunks[key] = Chunk(key, tuple(pages))
        return tuple(pages)

    def _evictable(self, keep: Collection[str] = ()) -> list[Chunk]:
        """Chunks whose only holder is the store, least recently used first."""
        return [c for c in self._chunks.values()
                if c.key not in keep and all(self.refs.count(p) == 1 for p in c.pages)]

    def evictable_pages(self, keep: Collection[str] = ()) -> int:
        return sum(len(c.pages) for c in self._evictable(keep))

    def evict(self, num_pages: int, keep: Collection[str] = ()) -> int:
        """Evict least recently used unheld chunks (not those in `keep`) until `num_pages` pages are freed."""
        freed = 0
        for chunk in self._evictable(keep):
            if freed >= num_pages:
                break
            del self._chunks[chunk.key]
            if self.on_evict is not None:
                self.on_evict(chunk.key, chunk.pages)
            freed += len(self.refs.release(chunk.pages))
            self.stats.evictions += 1
        return freed

    def forget(self) -> None:
        """Drop every chunk without releasing pages (the pool is being cleared wholesale)."""
        self._chunks.clear()

    def flush(self) -> int:
        return self.evict(self.evictable_pages())

    def canonical_pages(self) -> int:
        return sum(len(c.pages) for c in self._chunks.values())
