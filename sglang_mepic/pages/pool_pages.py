"""SGLang's paged KV allocator seen as whole pages (the `pages.PageAllocator` protocol).

SGLang hands out token slots, page-aligned; MEPIC shares and counts whole pages
(see docs/design.md, Ownership).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from sglang_mepic.pages import ownership

if TYPE_CHECKING:
    from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator


class PoolPages:
    def __init__(self, allocator: PagedTokenToKVPoolAllocator) -> None:
        if allocator.page_size < 2:
            raise ValueError("MEPIC chunk sharing needs a paged KV pool (--page-size 16 or another size > 1)")
        self.allocator = allocator
        self.page_size = allocator.page_size

    def alloc(self, n: int) -> list[int] | None:
        slots = self.allocator.alloc(n * self.page_size)
        return None if slots is None else self.pages_of(slots)

    def free(self, pages: list[int]) -> None:
        """Return pages whose last holder has let go (`PageRefs` has counted them already)."""
        ownership.return_pages(self.allocator, torch.tensor(pages, dtype=torch.int64, device=self.allocator.device))

    def available(self) -> int:
        return self.allocator.available_size() // self.page_size

    def pages_of(self, slots: torch.Tensor) -> list[int]:
        """The pages of page-aligned token slots (whole pages, in order), one per page."""
        return (slots[:: self.page_size] // self.page_size).tolist()

    def slots(self, pages: Iterable[int]) -> torch.Tensor:
        """The token slots of `pages`, in order."""
        p = torch.as_tensor(list(pages), dtype=torch.int64, device=self.allocator.device)
        return (p[:, None] * self.page_size + torch.arange(self.page_size, device=p.device)).reshape(-1)


# The allocator methods through which pages go back: the cache frees whole pages with
# `free_page_ids` (pool_pages.py; eviction never calls `free_segment`) and counts the frees of
# `free` (patches paged_allocator_free*). An allocator that overrides one of them would be bypassed.
FREE_PATH = ("free", "free_page_ids", "free_segment", "free_segments", "_release_page_ids")


def check_allocator(allocator: BaseTokenToKVPoolAllocator) -> None:
    """Refuse a KV allocator the cache cannot free through (e.g. SGLang's PageInterleavePoolAllocator,
    which keeps free pages per owner class and overrides `free_segment` and `_release_page_ids`)."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    name = type(allocator).__name__
    if not isinstance(allocator, PagedTokenToKVPoolAllocator):
        raise ValueError(f"--radix-cache-backend mepic needs SGLang's paged KV allocator, not {name}")
    changed = [m for m in FREE_PATH if getattr(type(allocator), m) is not getattr(PagedTokenToKVPoolAllocator, m)]
    if changed:
        raise ValueError(f"--radix-cache-backend mepic cannot free pages through {name}: it overrides "
                         f"{', '.join(changed)}, which the cache's eviction and page counting would bypass "
                         "(they return whole pages with free_page_ids); use the default paged allocator")
