"""Where the pool's pages go: each used page in exactly one category, by what holds it.

The capacity evaluation asks why one system fills a pool before another; the peak alone cannot say.
Every page the allocator has handed out is counted once, in the first category that claims it:

| category | the page |
|---|---|
| `compile_rows` | in the KV row of a compile row in flight (not yet a stored chunk) |
| `chunk_read_1`, `chunk_read_2_4`, `chunk_read_5_plus` | a stored chunk's, read by 1, 2-4 or 5+ running requests |
| `chunk_pinned` | a stored chunk's that no running request reads, held for a request not yet admitted |
| `chunk_evictable` | a stored chunk's that no running request reads, freed by an eviction |
| `private` | another page read by exactly one running request (prompt, first blocks, decode) |
| `shared_prefix` | another page read by 2 or more running requests (a radix-tree prefix they share) |
| `prefix_evictable` | another page no running request reads, freed by an eviction (the tree's cache) |
| `held_unread` | what is left: held, read by no running request, not evictable |

`pad_slots` counts the slots of the running requests' laid-out rows that hold pads (a slot read by two
requests counts twice): how much of `private` and the chunk categories is padding.

Pure: the caller (cache/anatomy.py) gathers the pages; here they are only counted, in one pass over
the used pages, so its cost follows the pool. It is computed when asked (/server_info), never per step.
"""

from collections.abc import Iterable

import torch

CATEGORIES = ("compile_rows", "chunk_read_1", "chunk_read_2_4", "chunk_read_5_plus", "chunk_pinned",
              "chunk_evictable", "private", "shared_prefix", "prefix_evictable", "held_unread")


def count(used: torch.Tensor, reads: Iterable[torch.Tensor], compile_pages: Iterable[torch.Tensor],
          chunk_pages: torch.Tensor, evictable: torch.Tensor | None, num_pages: int) -> dict[str, int]:
    """Pages by category (CATEGORIES, summing to `used.numel()`).

    used: the allocated page ids; reads: per running request, the ids of the pages its KV row reads;
    compile_pages: per compile row in flight, its pages; chunk_pages: pages any stored chunk holds;
    evictable: the pages an eviction of everything evictable would free (None: every page no running
    request reads, as in SGLang's own tree, where only running requests lock nodes); num_pages: the
    highest page id + 1."""
    readers = torch.zeros(num_pages, dtype=torch.int64)
    for pages in reads:
        readers[torch.unique(pages.cpu())] += 1
    in_compile = _mask(compile_pages, num_pages)
    is_chunk = _mask([chunk_pages], num_pages)
    unread_free = _mask([evictable], num_pages) if evictable is not None else readers == 0

    used = torch.unique(used.cpu())
    r, compiling, chunk, free = readers[used], in_compile[used], is_chunk[used] & ~in_compile[used], unread_free[used]
    other = ~compiling & ~chunk
    return {
        "compile_rows": int(compiling.sum()),
        "chunk_read_1": int((chunk & (r == 1)).sum()),
        "chunk_read_2_4": int((chunk & (r >= 2) & (r <= 4)).sum()),
        "chunk_read_5_plus": int((chunk & (r >= 5)).sum()),
        "chunk_pinned": int((chunk & (r == 0) & ~free).sum()),
        "chunk_evictable": int((chunk & (r == 0) & free).sum()),
        "private": int((other & (r == 1)).sum()),
        "shared_prefix": int((other & (r >= 2)).sum()),
        "prefix_evictable": int((other & (r == 0) & free).sum()),
        "held_unread": int((other & (r == 0) & ~free).sum()),
    }


def _mask(groups: Iterable[torch.Tensor], num_pages: int) -> torch.Tensor:
    mask = torch.zeros(num_pages, dtype=torch.bool)
    for pages in groups:
        if pages is not None and pages.numel():
            mask[pages.cpu().long()] = True
    return mask
