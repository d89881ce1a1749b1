"""Reference-counted pages on top of a page allocator.

`PageRefs` counts the holders of each allocated page and gives a page back to
the allocator when its last holder lets go; `FreeList` is a plain allocator.
Who holds pages, and how SGLang's own frees are counted: docs/design.md,
Ownership.
"""

from typing import Callable, Iterable, Protocol


class PageAllocator(Protocol):
    def alloc(self, n: int) -> list[int] | None: ...
    def free(self, pages: list[int]) -> None: ...
    def available(self) -> int: ...


class PageError(RuntimeError):
    """A holder released a page it does not hold: a bookkeeping bug, never user error."""


class FreeList:
    """A plain page allocator: pages 0..n-1. Used by the tests and as the model of SGLang's."""

    def __init__(self, num_pages: int) -> None:
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
    """Holders of allocated pages.

    A page the allocator handed out has one holder, implicitly: pages nobody
    shares cost nothing here and go back to the allocator exactly as before.
    `acquire` adds a holder; `release` removes one, and the last release returns
    the page to the allocator.
    """

    def __init__(self, allocator: PageAllocator) -> None:
        self.allocator = allocator
        self._extra: dict[int, int] = {}  # page -> holders beyond the first
        self.on_change: Callable[[list[int]], None] | None = None  # told of every page whose holders change
        # told, after on_change, of the pages whose last holder let go (about to go back to the allocator)
        self.on_gone: Callable[[list[int]], None] | None = None
        self.freed = 0  # pages whose last holder let go, ever: eviction measures its progress by it

    def alloc(self, n: int) -> list[int] | None:
        """n fresh pages, each held once, by the caller."""
        return self.allocator.alloc(n)

    def acquire(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        for p in pages:
            self._extra[p] = self._extra.get(p, 0) + 1
        if self.on_change is not None:
            self.on_change(pages)

    def releasable(self, pages: Iterable[int]) -> list[int]:
        """Drop one holder per page; returns the pages whose last holder this was.

        The caller returns those to the allocator."""
        pages = list(pages)
        if self.on_change is not None:
            self.on_change(pages)
        last = []
        for p in pages:
            extra = self._extra.get(p, 0)
            if extra == 0:
                last.append(p)
            elif extra == 1:
                del self._extra[p]
            else:
                self._extra[p] = extra - 1
        self.freed += len(last)
        if last and self.on_gone is not None:
            self.on_gone(last)
        return last

    def release(self, pages: Iterable[int]) -> list[int]:
        """Drop one holder per page and free the pages nobody holds any more."""
        freed = self.releasable(pages)
        if freed:
            self.allocator.free(freed)
        return freed

    def forget(self) -> None:
        """Drop all counts (the allocator is being cleared wholesale)."""
        self._extra.clear()

    def count(self, page: int) -> int:
        """Holders of an allocated page."""
        return 1 + self._extra.get(page, 0)

    def shared(self) -> int:
        """Pages with more than one holder."""
        return len(self._extra)
