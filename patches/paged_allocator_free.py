"""Token-slot frees of SGLang's paged allocator, counted per page like `free_page_ids`.

`free` takes token slots (a request's row, several slots per page) and releases
their pages, or, inside a free group, holds the slots until the group ends. With
the mepic radix cache attached, the slots' pages go through `free_page_ids`
instead, which drops their holders at once, so that the counts never wait for a
group's end; it releases or holds the pages exactly as `free` would.
"""

import torch

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.free"
HOOK_TYPE = HookType.AROUND


def hook(original, allocator, free_index):
    if getattr(allocator, "mepic_refs", None) is None or free_index.numel() == 0:
        return original(allocator, free_index)
    allocator.free_page_ids(torch.unique(free_index // allocator.page_size))
