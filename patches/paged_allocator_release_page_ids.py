"""Pages shared through MEPIC go back to the pool only when their last holder lets go.

Every page release of SGLang's paged allocator (free, free_segment, free groups)
ends in `_release_page_ids`. When the mepic radix cache has attached its
`PageRefs` to the allocator, each release drops one holder and only pages with
no holder left are released; pages nobody shares pass straight through.
"""

import torch

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.allocator.paged.PagedTokenToKVPoolAllocator._release_page_ids"
HOOK_TYPE = HookType.AROUND


def hook(original, allocator, *page_ids):
    refs = getattr(allocator, "mepic_refs", None)
    if refs is None or not page_ids:
        return original(allocator, *page_ids)
    ids = torch.cat(page_ids) if len(page_ids) > 1 else page_ids[0]
    # A host round trip per release; the counts live in Python next to the chunk store.
    last = refs.releasable(ids.tolist())
    if last:
        original(allocator, torch.tensor(last, dtype=ids.dtype, device=ids.device))
