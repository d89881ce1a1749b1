"""Token-slot frees of SGLang's paged allocator, counted per page (`ownership.free`).

`free` takes token slots (a request's row, several slots per page). See
docs/design.md, Ownership.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.pages import ownership

if TYPE_CHECKING:
    import torch
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.free"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], allocator: PagedTokenToKVPoolAllocator, free_index: torch.Tensor) -> None:
    return ownership.free(original, allocator, free_index)
