"""Token-slot frees of SGLang's paged allocator, counted per page (`ownership.free`).

`free` takes token slots (a request's row, several slots per page). See
docs/design.md, Ownership.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.pages import ownership

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.free"
HOOK_TYPE = HookType.AROUND


def hook(original, allocator, free_index):
    return ownership.free(original, allocator, free_index)
