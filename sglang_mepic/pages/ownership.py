"""The allocator's side of page ownership: SGLang's frees drop one holder per page.

The mepic radix cache owns one `PoolOwnership` per KV allocator and registers it
beside the allocator (a side table: the allocator is the one object both the cache
and SGLang's frees hold); the patched `free_page_ids` and `free` of SGLang's paged
allocator call `free_page_ids` and `free` below, which find it there. An allocator
nobody owns frees as SGLang does. A registration lasts as long as its ownership,
which the cache holds: it goes with the cache. Who holds a page and when it goes
back: docs/design.md, Ownership.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch

from sglang_mepic.pages.refs import PageRefs
from sglang_mepic.side_table import SideTable

if TYPE_CHECKING:
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator


class PoolOwnership:
    """The holders (`refs`) of the pages of one SGLang paged allocator."""

    def __init__(self, allocator: PagedTokenToKVPoolAllocator, refs: PageRefs) -> None:
        self.allocator = allocator
        self.refs = refs
        self._returning = False  # the cache is giving back pages whose holders it has dropped itself

    @contextmanager
    def returning(self) -> Iterator[None]:
        """Frees inside the block pass straight through: their holders are counted already."""
        self._returning = True
        try:
            yield
        finally:
            self._returning = False

    def free_page_ids(self, original: Callable[..., Any], page_ids: torch.Tensor) -> None:
        if self._returning:
            return original(self.allocator, page_ids)
        # A host round trip per free; the counts live in Python next to the chunk store.
        last = self.refs.releasable(page_ids.tolist())
        if last:  # to be released now, or at the end of a free group, as SGLang would
            original(self.allocator, torch.tensor(last, dtype=page_ids.dtype, device=page_ids.device))


_OWNERS: SideTable[weakref.ref[PoolOwnership]] = SideTable("ownership of an allocator's pages")


def register(allocator: PagedTokenToKVPoolAllocator, refs: PageRefs) -> PoolOwnership:
    """The ownership of `allocator`'s pages by `refs` (replacing an earlier owner's), for as long as the
    returned ownership lives."""
    owner = PoolOwnership(allocator, refs)
    _OWNERS.set(allocator, weakref.ref(owner))
    return owner


def owner_of(allocator: PagedTokenToKVPoolAllocator) -> PoolOwnership | None:
    ref = _OWNERS.get(allocator)
    return None if ref is None else ref()


def return_pages(allocator: PagedTokenToKVPoolAllocator, page_ids: torch.Tensor) -> None:
    """Give pages whose last holder has let go back to `allocator`, without counting them again."""
    owner = owner_of(allocator)
    if owner is None:
        allocator.free_page_ids(page_ids)
        return
    with owner.returning():
        allocator.free_page_ids(page_ids)


def free_page_ids(original: Callable[..., Any], allocator: PagedTokenToKVPoolAllocator, page_ids: torch.Tensor) -> None:
    """SGLang's `free_page_ids`, dropping one holder per page of an owned allocator."""
    owner = owner_of(allocator)
    if owner is None or page_ids.numel() == 0:
        return original(allocator, page_ids)
    owner.free_page_ids(original, page_ids)


def free(original: Callable[..., Any], allocator: PagedTokenToKVPoolAllocator, free_index: torch.Tensor) -> None:
    """SGLang's `free` of token slots: an owned allocator's go as their pages, through `free_page_ids`
    (counted at once, inside a free group too, where `free` would hold the slots to the group's end)."""
    if free_index.numel() == 0 or owner_of(allocator) is None:
        return original(allocator, free_index)
    allocator.free_page_ids(torch.unique(free_index // allocator.page_size))
