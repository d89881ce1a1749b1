"""The one entry that plans a laid-out request, and its frozen result.

    shape (link.py) + resident chunks (residency.py) + mode  ->  Planned

Every difference between the modes lives here: the shared modes (mepic, naive)
and a compile reorder the request's pages so the reused canonical pages form
SGLang's prefix (plan.py); EPIC does the same from each chunk's first K tokens
on, with tree tags of its own (its prefix becomes a private copy at admission);
CacheBlend keeps the natural order and names the canonical slot that replaces
each computed one. The radix cache applies the result (matches its key, injects
its reused pages); nothing here touches the tree, the pool or the store.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, cast

import torch

from sglang_mepic import modes
from sglang_mepic.cache.plan import Plan, arrangement_tag, make_plan, page_tag, private, sources
from sglang_mepic.wire.layout import NO_POSITION, PAD_ID

if TYPE_CHECKING:
    from sglang_mepic.cache.shape import Shape


@dataclass(frozen=True)
class Planned:
    plan: Plan | None = None                # page order; None: natural order, nothing reused in place
    sources: tuple[int, ...] | None = None  # CacheBlend: canonical slot per natural slot, or -1
    private_key: int | None = None          # CacheBlend: the key's first id, unique to this request

    @property
    def reuses(self) -> bool:
        """Whether stored pages form the request's prefix (the cache injects them after the tree's match)."""
        return self.plan is not None and bool(self.plan.reused)

    @cached_property
    def slot_index(self) -> torch.Tensor:
        """Natural slot of each planned prompt slot, gathered a page at a time."""
        return cast(Plan, self.plan).slot_order()  # asked only of a plan that reuses

    @cached_property
    def order(self) -> tuple[int, ...] | None:
        """Natural slot of each planned prompt slot (None: natural order)."""
        return tuple(self.slot_index.tolist()) if self.reuses else None

    @cached_property
    def reused_slots(self) -> torch.Tensor:
        """Physical KV slots of the planned prefix, in order."""
        return cast(Plan, self.plan).reused_slots()  # asked only of a plan that reuses

    @staticmethod
    def natural_key(token_ids: Iterable[int], positions: torch.Tensor) -> array[int]:
        """Token ids with pad slots (no position) as PAD_ID, so a pad never matches a real token."""
        out = array("q", token_ids)
        for i in (positions == NO_POSITION).nonzero().flatten().tolist():
            out[i] = PAD_ID
        return out

    def key(self, token_ids: Iterable[int], positions: torch.Tensor) -> array[int]:
        """The radix-tree key of `token_ids` in planned order: pads as PAD_ID, each reused
        canonical page tagged with its chunk (plan.page_tag), each computed page after a reused
        one tagged with how many reused pages precede it (plan.arrangement_tag), and a
        CacheBlend request's first id its own."""
        out = self.natural_key(token_ids, positions)
        if self.private_key is not None and out:
            out[0] = self.private_key
        if self.reuses:
            plan = cast(Plan, self.plan)  # it reuses: a plan
            page_size = plan.page_size
            pages = -(-len(out) // page_size)
            for k, tag in enumerate(plan.tags[:pages]):
                out[k * page_size] = tag
            for k, before in enumerate(plan.reused_before[:max(0, pages - len(plan.tags))], start=len(plan.tags)):
                if before:
                    out[k * page_size] = arrangement_tag(out[k * page_size], before)
        return out


def plan(shape: Shape, resident: dict[str, tuple[int, ...]], mode: modes.Mode, page_size: int,
         canonical_from: int | None, logprob_start: int | None, holds_natural: bool = False) -> Planned:
    """Plan `shape` (shape.Shape) against the chunks `resident` on the device (key -> canonical pages).

    logprob_start: the first slot whose input logprob is asked; chunks that end after it are
    computed (SGLang likewise limits its prefix match there), and pages from there keep their places.
    holds_natural: a compile whose chunk the tree holds whole in natural order (the tree's earlier
    compile of it): natural order then costs nothing, where the planned one computes a block.
    """
    spans = shape.spans()
    how = modes.planning(mode)
    if shape.compile or how is modes.Planning.SHARED:
        p = make_plan(shape.size, page_size, spans, resident, canonical_from, logprob_start)
        if p.reused and shape.compile and holds_natural:
            return Planned()
    elif how is modes.Planning.PRIVATE_PREFIX:
        # Planned like mepic from each chunk's first K tokens on; its prefix is copied into
        # pages of the request's own at admission, and no other request may match it.
        lead = modes.epic_lead_pages(mode, page_size)
        tail = {key: pages[lead:] for key, pages in resident.items()}
        p = private(make_plan(shape.size, page_size, spans, tail, lead, logprob_start), str(shape.owner))
    elif how is modes.Planning.BLEND:
        natural_pos = shape.natural_positions(shape.size).tolist()
        src, _, _ = sources(shape.size, page_size, spans, resident, natural_pos, 0, logprob_start)
        # Which slots are recomputed is chosen per request, over its whole extend, so blended KV
        # is this request's alone: no other request (not one with the same tokens, not one
        # sharing a prefix) may match it in the tree.
        mine = page_tag(f"{shape.owner}\x1fcacheblend", 0) if any(s >= 0 for s in src) else None
        return Planned(sources=tuple(src), private_key=mine)
    else:
        return Planned()
    return Planned(p)
