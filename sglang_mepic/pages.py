"""Reference-counted pages on top of a page allocator.

SGLang's paged allocator hands out pages and takes them back, with no notion of
sharing. MEPIC shares a chunk's canonical pages between the chunk store, radix
tree nodes and running requests, so every page gets a count of its holders and
goes back to the allocator exactly when the last one lets go.
"""

from typing import Iterable, Protocol


class PageAllocator(Protocol):
    def alloc(self, n: int) -> list[int] | None: ...
    def free(self, pages: list[int]) -> None: ...
    def available(self) -> int: ...


class PageError(RuntimeError):
    """A holder released a page it does not hold: a bookkeeping bug, never user error."""


class FreeList:
    """A plain page allocator: pages 0..n-1. Used by the tests and as the model of SGLang's."""

    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))
        self._is_free = [True] * num_pages

    def alloc(self, n: int) -> list[int] | None:
        if n > len(self._free):
            return None
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._is_free[p] = False
        return pages

    def free(self, pages: list[int]) -> None:
        for p in pages:
            if self._is_free[p]:
                raise PageError(f"page {p} freed twice")
            self._is_free[p] = True
            self._free.append(p)

    def available(self) -> int:
        return len(self._free)


class PageRefs:
    def __init__(self, allocator: PageAllocator):
        self.allocator = allocator
        self._refs: dict[int, int] = {}

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages, each with one reference owned by the caller."""
        pages = self.allocator.alloc(n)
        if pages is not None:
            for p in pages:
                self._refs[p] = 1
        return pages

    def acquire(self, pages: Iterable[int]) -> None:
        for p in pages:
            if p not in self._refs:
                raise PageError(f"page {p} is not allocated")
            self._refs[p] += 1

    def release(self, pages: Iterable[int]) -> list[int]:
        """Drop one reference per page; returns the pages that went back to the allocator."""
        freed = []
        for p in pages:
            count = self._refs.get(p, 0)
            if count == 0:
                raise PageError(f"page {p} released with no reference held")
            if count == 1:
                del self._refs[p]
                freed.append(p)
            else:
                self._refs[p] = count - 1
        if freed:
            self.allocator.free(freed)
        return freed

    def count(self, page: int) -> int:
        return self._refs.get(page, 0)

    def in_use(self) -> int:
        return len(self._refs)

    def shared(self) -> int:
        return sum(1 for c in self._refs.values() if c > 1)
