"""SGLang's paged KV allocator seen as whole pages (the `pages.PageAllocator` protocol).

SGLang hands out token slots, page-aligned; MEPIC shares and counts whole pages
(see docs/design.md, Ownership).
"""

import torch

from sglang_mepic import ownership


class PoolPages:
    def __init__(self, allocator):
        if allocator.page_size < 2:
            raise ValueError("MEPIC chunk sharing needs a paged KV pool (--page-size 16 or another size > 1)")
        self.allocator = allocator
        self.page_size = allocator.page_size

    def alloc(self, n: int) -> list[int] | None:
        slots = self.allocator.alloc(n * self.page_size)
        return None if slots is None else (slots[:: self.page_size] // self.page_size).tolist()

    def free(self, pages: list[int]) -> None:
        """Return pages whose last holder has let go (`PageRefs` has counted them already)."""
        ownership.return_pages(self.allocator, torch.tensor(pages, dtype=torch.int64, device=self.allocator.device))

    def available(self) -> int:
        return self.allocator.available_size() // self.page_size

    def slots(self, pages) -> torch.Tensor:
        """The token slots of `pages`, in order."""
        p = torch.as_tensor(list(pages), dtype=torch.int64, device=self.allocator.device)
        return (p[:, None] * self.page_size + torch.arange(self.page_size, device=p.device)).reshape(-1)
