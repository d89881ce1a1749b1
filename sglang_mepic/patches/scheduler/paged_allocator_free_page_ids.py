"""Page frees of SGLang's paged allocator drop one holder per page (`ownership.free_page_ids`).

Tree eviction and `free_segment` end here; so do `free`'s token slots when the
allocator is owned (patch paged_allocator_free). See docs/design.md, Ownership.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.pages import ownership

if TYPE_CHECKING:
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.free_page_ids"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], allocator: PagedTokenToKVPoolAllocator, page_ids: torch.Tensor) -> None:
    return ownership.free_page_ids(original, allocator, page_ids)
