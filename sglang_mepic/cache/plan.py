"""The placement plan of one laid-out request: which pages are reused, what is computed.

    request slots (layout.py / slots.py) + chunk store  ->  Plan

SGLang computes a request as [prefix it already has][tokens to extend]. MEPIC
needs to compute a request's prompt pages and each chunk's first block while
reusing the chunks' other pages where they are. The plan reconciles the two by
*ordering the request's pages*: the reused canonical pages come first, in
request order, and form SGLang's prefix; every other page follows in request
order and is the extend. Attention never depends on slot order, only on each
slot's RoPE position (`positions.PositionMap`), so the reordering is free:

    natural:  [prompt][C1 b0][C1 b1][C1 b2][prompt][C2 b0][C2 b1][question]
    planned:  [C1 b1][C1 b2][C2 b1] | [prompt][C1 b0][prompt][C2 b0][question]
              `-- reused, shared --'   `-- computed, positions ascending --'

Computed pages keep their request order, so every computed token's context is
either in the prefix or earlier in the extend, as chunked prefill requires. A
chunk missing from the store is computed whole, in context (a miss).

EPIC is planned the same way, from each chunk's first K tokens (whole pages) on,
but its prefix is a private copy of the reused pages (`private` keeps the tree
from matching them for anyone else). CacheBlend keeps the natural order and
computes every slot into pages of its own; `sources` names, per slot, the
canonical slot whose KV replaces the computed one (the copy) unless the mode
recomputes it.
"""

import bisect
import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Sequence

import torch

from sglang_mepic.wire.layout import NO_POSITION


@dataclass(frozen=True)
class ChunkSpan:
    start: int   # first slot, page-aligned
    end: int     # one past the last slot, page-aligned
    key: str     # chunk hash


@dataclass(frozen=True)
class Plan:
    size: int                     # slots of the request's prompt
    page_size: int
    order: tuple[int, ...]        # natural page index of each page, in planned order
    reused: tuple[int, ...]       # canonical page of each of the first len(reused) planned pages
    hits: int                     # chunk occurrences found in the store
    misses: int
    tags: tuple[int, ...] = ()    # tree-key tag of each reused page (`page_tag`)
    # Per planned page after the reused ones: how many reused pages precede it in request order.
    reused_before: tuple[int, ...] = ()
    # Per reused chunk occurrence: (chunk key, its first page among the reused ones, its page count).
    runs: tuple[tuple[str, int, int], ...] = ()

    @property
    def prefix_slots(self) -> int:
        return len(self.reused) * self.page_size

    def slot_order(self) -> torch.Tensor:
        """Natural slot of each planned prompt slot, gathered a page at a time."""
        return _slots(self.order, self.page_size, self.size)

    def reused_slots(self) -> torch.Tensor:
        """Physical KV slots of the planned prefix, in order."""
        return _slots(self.reused, self.page_size)


def _slots(pages: Sequence[int], page_size: int, below: int | None = None) -> torch.Tensor:
    index = (torch.tensor(pages, dtype=torch.long)[:, None] * page_size + torch.arange(page_size)).flatten()
    return index if below is None else index[index < below]


def make_plan(size: int, page_size: int, chunks: Sequence[ChunkSpan], resident: dict[str, tuple[int, ...]],
              canonical_from: int | None, reuse_before: int | None = None) -> Plan:
    """Order the pages of a request of `size` slots.

    resident: chunk hash -> its canonical pages (the chunk's pages from `canonical_from` on).
    canonical_from: leading pages of each chunk computed in context; None = all (nothing reused).
    reuse_before: only chunks that end at or before this slot are reused; the rest are computed
    in context (input logprobs from there on: logprobs.py). Pages from there on keep their places.
    """
    b = page_size
    hits = misses = 0
    reused_pages: list[int] = []
    reused: list[int] = []
    tags: list[int] = []
    runs: list[tuple[str, int, int]] = []
    for c in chunks:
        if c.start % b or c.end % b:
            raise ValueError(f"chunk span [{c.start}, {c.end}) is not page-aligned (page size {b})")
        canonical = resident.get(c.key)
        if canonical is None:
            misses += 1
            continue
        hits += 1
        if canonical_from is None or (reuse_before is not None and c.end > reuse_before):
            continue
        first, last = c.start // b + canonical_from, c.end // b
        if len(canonical) != max(0, last - first):
            raise ValueError(f"chunk {c.key} has {len(canonical)} canonical pages, expected {max(0, last - first)}")
        runs.append((c.key, len(reused), len(canonical)))
        reused_pages += range(first, last)
        reused += canonical
        tags += (page_tag(c.key, i) for i in range(len(canonical)))
    taken = set(reused_pages)
    rest = [p for p in range(-(-size // b)) if p not in taken]
    before = [bisect.bisect_left(reused_pages, p) for p in rest]  # reused_pages ascend: chunks come in order
    return Plan(size, b, tuple(reused_pages + rest), tuple(reused), hits, misses, tuple(tags), tuple(before),
                tuple(runs))


@functools.lru_cache(maxsize=1 << 16)  # chunks recur: the same tags, match after match
def page_tag(chunk_key: str, index: int) -> int:
    """The id that stands for a reused canonical page's first token in the radix-tree key.

    A canonical page's KV was computed after the earlier pages of its own chunk. Keyed by
    its tokens alone, the tree would serve it to a plain prompt (or another chunk) with the
    same tokens in another context, and serve their KV to this chunk. The tag is negative,
    so it is never a token id, and never PAD_ID (-1).
    """
    digest = hashlib.blake2b(f"{chunk_key}/{index}".encode(), digest_size=7).digest()
    return -2 - int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=1 << 16)
def arrangement_tag(first_id: int, reused_before: int) -> int:
    """The id that stands for a computed page's first token in the radix-tree key when reused
    pages precede it in request order.

    The key lists the reused pages first and the computed pages after them, so without this
    it would not say where among the computed pages each reused page sat: [C][A + q] and
    [A][C][q] (A a page equal to C's first) planned to one key, and the second request was
    served KV the first computed for a page that had seen C. A computed page's KV depends
    on everything before it in request order; given the same reused pages (the key's prefix)
    and the same computed pages, the count of reused pages before each computed page fixes
    that order, so keys are equal exactly when the KV is.
    """
    digest = hashlib.blake2b(f"arranged/{first_id}/{reused_before}".encode(), digest_size=7).digest()
    return -2 - int.from_bytes(digest, "big")


def private(plan: Plan, owner: str) -> Plan:
    """The plan with tree tags of one owner's own: its reused pages are private copies
    (EPIC), so no other request may match them in the tree."""
    return dataclasses.replace(plan, tags=tuple(page_tag(f"{owner}\x1f{key}", i)
                                                for i, key in enumerate(plan.tags)))


def sources(size: int, page_size: int, chunks: Sequence[ChunkSpan], resident: dict[str, tuple[int, ...]],
            positions: Sequence[int], keep_tokens: int, reuse_before: int | None = None) -> tuple[list[int], int, int]:
    """CacheBlend: per natural slot, the canonical KV slot that replaces it, or -1.

    Of each resident chunk, the first `keep_tokens` real tokens are left to compute (none for
    CacheBlend, which selects per layer); the chunk store holds the whole chunk (canonical_from = 0).
    Chunks that end after `reuse_before` are computed whole, as in `make_plan`.
    Returns (sources, hits, misses).
    """
    b = page_size
    src = [-1] * size
    hits = misses = 0
    for c in chunks:
        canonical = resident.get(c.key)
        if canonical is None:
            misses += 1
            continue
        hits += 1
        if reuse_before is not None and c.end > reuse_before:
            continue
        real = 0
        for s in range(c.start, c.end):
            if positions[s] == NO_POSITION:
                continue
            if real >= keep_tokens:
                src[s] = canonical[(s - c.start) // b] * b + (s - c.start) % b
            real += 1
    return src, hits, misses
