"""A batch's readers are pointed at the pages its compile rows write (scheduler side).

SGLang has allocated the batch: its compile rows start running (`CompileRows.admitted`),
and each request planned to read a chunk one of them computes has its KV row pointed at
that row's canonical pages, which it holds until it releases its row. This runs before the
forward, so the reader reads them in that forward (compile_rows.py says why it may).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from sglang_mepic.cache.compile_rows import CompileRows, canonical_slots
from sglang_mepic.cache.link import link_of
from sglang_mepic.pages.pool_pages import PoolPages
from sglang_mepic.pages.refs import PageRefs

if TYPE_CHECKING:
    import torch
    from sglang.srt.managers.schedule_batch import Req

    from sglang_mepic.cache.link import Link
    from sglang_mepic.cache.plan import Plan
    from sglang_mepic.cache.planner import Planned


class Readers:
    def __init__(self, *, rows: CompileRows, pages: PoolPages, refs: PageRefs, page_size: int,
                 canonical_from: int | None) -> None:
        self.rows, self.pages, self.refs = rows, pages, refs
        self.page_size, self.canonical_from = page_size, canonical_from

    def point(self, reqs: Iterable[Req], req_to_token: torch.Tensor) -> None:
        """`reqs` are an allocated batch's; `req_to_token` its KV rows (SGLang's table)."""
        for req in reqs:
            link = link_of(req)
            if link is not None and link.compile and req.kv.req_pool_idx is not None:
                whole = req.kv.kv_allocated_len >= link.chunk_slots[0][1]
                pages = tuple(self.pages.pages_of(self._slots(req, req_to_token)))
                self.rows.admitted(req, link.keys[0], pages if whole else None)
        for req in reqs:
            link = link_of(req)
            if link is None or not link.compiling or req.kv.req_pool_idx is None \
                    or cast("Planned", link.planned).plan is None:  # compiling: planned
                continue
            self._point(req, link, req_to_token)
            # Pointed once, at its first forward: a chunked prefill's later parts read the row as it is
            # (SGLang frees the compile row's request row when it finishes).
            link.compiling = {}

    def _point(self, req: Req, link: Link, req_to_token: torch.Tensor) -> None:
        row, b = req_to_token[req.kv.req_pool_idx], self.page_size
        for key, first, count in cast("Plan", cast("Planned", link.planned).plan).runs:  # point() checked it has one
            compile_row = link.compiling.get(key)
            if compile_row is None:
                continue
            assert compile_row.kv.req_pool_idx is not None, "a reader was admitted without its compile row"
            slots = self._slots(compile_row, req_to_token)
            lo, hi = max(first * b, link.tree_len), min((first + count) * b, req.prefix_len)
            if hi <= lo:
                continue
            part = slots[lo - first * b:hi - first * b]
            row[lo:hi] = part
            injected = cast("torch.Tensor", link.injected)  # its prefix reaches past the tree's match: injected
            injected[lo - link.tree_len:hi - link.tree_len] = part.to(injected.device, injected.dtype)
            pages = self.pages.pages_of(part)
            self.refs.acquire(pages)
            link.held += pages

    def _slots(self, compile_row: Req, req_to_token: torch.Tensor) -> torch.Tensor:
        # A compile row is made only for a chunk the store keeps pages of: canonical_from is an int.
        return canonical_slots(compile_row, req_to_token, self.page_size, cast(int, self.canonical_from))
