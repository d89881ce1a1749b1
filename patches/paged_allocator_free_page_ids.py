"""Pages shared through MEPIC go back to the pool only when their last holder lets go.

SGLang's paged allocator frees pages through `free_page_ids` (tree eviction and
`free_segment` end there) or `free` (below). When the mepic radix cache has
attached its `PageRefs` to the allocator, each page freed drops one holder at
once, inside a free group too, and only pages with no holder left are passed on
(to be released now, or at the group's end); pages nobody shares pass straight
through. `PoolPages.free` passes pages whose holders it has already dropped.
"""

import torch

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator.free_page_ids"
HOOK_TYPE = HookType.AROUND


def hook(original, allocator, page_ids):
    refs = getattr(allocator, "mepic_refs", None)
    if refs is None or getattr(allocator, "mepic_counted", False) or page_ids.numel() == 0:
        return original(allocator, page_ids)
    # A host round trip per free; the counts live in Python next to the chunk store.
    last = refs.releasable(page_ids.tolist())
    if last:
        original(allocator, torch.tensor(last, dtype=page_ids.dtype, device=page_ids.device))
