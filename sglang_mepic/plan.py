"""The placement plan of one request: where each page comes from, what to compute.

    layout (segments.py) + radix prefix hit + chunk store  ->  Plan

The plan is the input to the recompute pass and to the attention backend's
per-slot position map. For every page of the request it records its source:

- PREFIX:  matched in the radix tree (prompt pages and request-specific first
           blocks of an identical earlier request); nothing to compute.
- SHARED:  a canonical page of a resident chunk; reused as it is, never copied.
- COMPUTE: a new page whose real tokens are computed in this request's context
           (uncached prompt tokens, and the first `recompute_blocks` pages of
           each chunk).
- COMPILE: a new canonical page of a chunk seen for the first time; the whole
           chunk is computed standalone, then its pages go to the chunk store.
"""

import enum
from dataclasses import dataclass

from sglang_mepic.segments import NO_POSITION, Kind, Layout


class Source(enum.Enum):
    PREFIX = "prefix"
    SHARED = "shared"
    COMPUTE = "compute"
    COMPILE = "compile"


@dataclass(frozen=True)
class PagePlan:
    source: Source
    chunk: str | None = None       # chunk hash, for pages of a chunk segment
    page: int | None = None        # physical page, for SHARED pages


@dataclass(frozen=True)
class Plan:
    layout: Layout
    pages: tuple[PagePlan, ...]
    positions: tuple[int, ...]            # RoPE position per slot, NO_POSITION for pads
    compile: tuple[tuple[str, int], ...]  # (chunk hash, segment index) compiled standalone

    @property
    def page_size(self) -> int:
        return self.layout.page_size

    def count(self, source: Source) -> int:
        return sum(1 for p in self.pages if p.source is source)

    @property
    def new_pages(self) -> int:
        return self.count(Source.COMPUTE) + self.count(Source.COMPILE)

    def compute_slots(self) -> list[int]:
        """Non-pad slots computed in this request's context."""
        b = self.page_size
        return [s for i, p in enumerate(self.pages) if p.source is Source.COMPUTE
                for s in range(i * b, (i + 1) * b)
                if s < len(self.positions) and self.positions[s] != NO_POSITION]


def make_plan(layout: Layout, chunk_keys: dict[int, str], prefix_len: int,
              resident: dict[str, tuple[int, ...]], recompute_blocks: int | None = 1) -> Plan:
    """Build the plan.

    chunk_keys: segment index -> chunk hash, for every chunk segment.
    prefix_len: slots matched by the radix tree (a whole number of pages).
    resident: chunk hash -> canonical pages, for chunks resident in the store.
    recompute_blocks: leading pages of each chunk computed in context; None = all
        (then nothing is shared and the request equals full recompute).
    """
    b = layout.page_size
    if prefix_len % b:
        raise ValueError(f"prefix_len {prefix_len} is not a multiple of the page size {b}")
    first_new_page = prefix_len // b
    pages: list[PagePlan] = []
    compile: list[tuple[str, int]] = []
    for index, seg in enumerate(layout.segments):
        n_pages = -(-seg.size // b)
        first_page = seg.start // b
        if seg.kind is Kind.PROMPT:
            pages += [PagePlan(Source.COMPUTE) for _ in range(n_pages)]
            continue
        key = chunk_keys[index]
        k = n_pages if recompute_blocks is None else min(recompute_blocks, n_pages)
        canonical = resident.get(key)
        if canonical is None and k < n_pages and first_page + n_pages > first_new_page:
            compile.append((key, index))
        for j in range(n_pages):
            if j < k:
                pages.append(PagePlan(Source.COMPUTE, key))
            elif canonical is not None:
                pages.append(PagePlan(Source.SHARED, key, canonical[j - 1]))
            else:
                pages.append(PagePlan(Source.COMPILE, key))
    # What the radix tree already holds overrides everything else.
    pages[:first_new_page] = [PagePlan(Source.PREFIX, p.chunk) for p in pages[:first_new_page]]
    return Plan(layout, tuple(pages), tuple(layout.slot_positions()), tuple(compile))
