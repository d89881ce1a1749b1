"""Scheduler-side state of one laid-out request (`link_of(req)`), and its phases.

`Linker` makes it once, the first time the scheduler sees the request: the one place the
scheduler decodes a hint (wire/hint.py).

A request arrives laid out in its natural slot order with the `mepic.chunks`
hint (hint.py). Its `Shape` (ids, pads, chunks and their keys) never changes.
Around it, the request moves through three phases, and every move is checked:

    LINKED --plan--> PLANNED --admit--> ADMITTED --release--> LINKED
       ^                |
       +----let go------+   (not admitted this round, or planned again)

- PLANNED: the cache matched it (planner.py): it holds the stored chunks it
  will read and its token ids are in planned order.
- ADMITTED: it has a KV row; its plan is fixed until it releases the row (a
  retracted request is planned again from its natural order).
"""

from __future__ import annotations

import enum
import itertools
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import torch

from sglang_mepic.config import Placement
from sglang_mepic.cache.compile_rows import layout_of
from sglang_mepic.cache.plan import ChunkSpan, Plan
from sglang_mepic.cache.planner import Planned
from sglang_mepic.cache.shape import Shape
from sglang_mepic.wire.chunk_keys import cache_namespace, chunk_keys
from sglang_mepic.wire.hint import decode_laid_out
from sglang_mepic.wire.report import Report
from sglang_mepic.wire.layout import NO_POSITION

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


ATTR = "mepic"  # the one attribute this package sets on SGLang's (scheduler-side) Req


def link_of(req: Req) -> Link | None:
    """The request's Link, set when the mepic cache first laid it out; None: not laid out (a plain
    request, or one under another cache). Every module reaches request state through this."""
    return getattr(req, ATTR, None)


def attach(req: Req, link: Link) -> Link:
    setattr(req, ATTR, link)
    return link


class Phase(enum.Enum):
    LINKED = "linked"
    PLANNED = "planned"
    ADMITTED = "admitted"


class PhaseError(RuntimeError):
    """A request state moved in a way its lifecycle does not allow (a bug, never client input)."""


@dataclass(eq=False)
class Link:
    shape: Shape
    phase: Phase = Phase.LINKED
    planned: Planned | None = None
    held: list[int] = field(default_factory=list)  # pages this request holds a reference on
    held_private: bool = False          # they are its own already (loaded from the host for it): no copy to make
    found: list[str] | None = None      # where each chunk was found when planned: device, host, storage, absent
    # The match: reused KV slots appended to the tree's (None: none), the slots the tree matched
    # before them, and how many of them the tree has since taken its own reference on.
    injected: torch.Tensor | None = None
    tree_len: int = 0
    tree_took: int = 0
    # Per chunk key: the compile row in this request's batch that computes it (compile_rows.py);
    # set when planned, the chunk's planned pages are placeholders until the batch is allocated.
    compiling: dict[str, Req] = field(default_factory=dict)
    wait: bool = False                  # planned, but must not be admitted this round (compile_rows.py)
    made_for: set[str] = field(default_factory=set)  # chunk keys a compile row was made for it for, in any plan
    compiled: tuple[int, ...] = ()      # chunk segments computed in its own batch (known at admission)
    own_reuse: int = 0                  # real tokens it reuses from those (figures.compiled_reuse), at admission
    report: Report | None = None        # its figures, for its response (report.py), once admitted
    _positions: tuple = (None, -1, None)  # (planned, num_slots, positions): match, insert and admit ask alike
    _real_before: tuple = (None, None)     # (planned, real prompt slots before each planned slot)
    _real_prompt: tuple = (-1, 0)          # (prompt slots asked, real tokens among them): output_report
    # What `planned` was made from (reuse_plan), and the last key `masked` made: (planned, ids, key).
    _planned_from: tuple | None = None
    _masked: tuple = (None, None, None)

    # ---- phases ---------------------------------------------------------------

    def _move(self, allowed: tuple[Phase, ...], to: Phase) -> None:
        if self.phase not in allowed:
            raise PhaseError(f"request state: {self.phase.value} -> {to.value} is not a transition")
        self.phase = to

    def set_planned(self, planned: Planned, made_from: tuple | None = None) -> None:
        self._move((Phase.LINKED,), Phase.PLANNED)
        self.planned, self._planned_from = planned, made_from

    def reuse_plan(self, made_from: tuple) -> Planned | None:
        """The last plan, where it was made from what the planner would be given now (the chunks resident and
        their pages, and the request's own settings): a request still waiting, matched again next round with
        its chunks where they were, has the same plan, and keeps the positions and keys made of it."""
        return self.planned if self._planned_from is not None and self._planned_from == made_from else None

    def unplan(self) -> None:
        """Back to linked before it is planned again, or when its round ended without it."""
        self._move((Phase.LINKED, Phase.PLANNED), Phase.LINKED)

    def admit(self) -> None:
        self._move((Phase.PLANNED,), Phase.ADMITTED)

    def release(self) -> None:
        self._move((Phase.LINKED, Phase.PLANNED, Phase.ADMITTED), Phase.LINKED)
        self.injected, self.tree_took, self.compiling = None, 0, {}

    def found_where(self, where: list[str]) -> None:
        """Where each chunk was found when first planned. A plan that found nothing (or could not
        load it for lack of room) yields to a later one, as the request is computed by the last."""
        self.found = list(where) if self.found is None else [new if old == "absent" else old
                                                             for old, new in zip(self.found, where)]

    @property
    def admitted(self) -> bool:
        return self.phase is Phase.ADMITTED

    # ---- what the shape and the plan say ----------------------------------------

    natural = property(lambda self: self.shape.natural)
    pads = property(lambda self: self.shape.pads)
    chunk_slots = property(lambda self: self.shape.chunk_slots)
    keys = property(lambda self: self.shape.keys)
    compile = property(lambda self: self.shape.compile)
    size = property(lambda self: self.shape.size)

    @property
    def plan(self) -> Plan | None:
        return self.planned.plan if self.planned is not None else None

    @property
    def private_key(self) -> int | None:
        return self.planned.private_key if self.planned is not None else None

    @property
    def order(self) -> tuple[int, ...] | None:
        """Natural slot of each planned prompt slot (None: natural order)."""
        return self.planned.order if self.planned is not None else None

    @property
    def sources(self) -> tuple[int, ...] | None:
        return self.planned.sources if self.planned is not None else None

    def spans(self) -> list[ChunkSpan]:
        return self.shape.spans()

    def pad_slots(self) -> list[bool]:
        return self.shape.pad_slots()

    def real_prompt_tokens(self, slots: int) -> int:
        """`slots` less the pads wholly within them: the prompt tokens SGLang's output streamer reports,
        asked at every streamed output with the same count, so the last answer is kept."""
        asked, real = self._real_prompt
        if asked != slots:
            real = slots - self.shape.pads_within(slots)
            self._real_prompt = (slots, real)
        return real

    def natural_positions(self, num_slots: int) -> torch.Tensor:
        return self.shape.natural_positions(num_slots)

    def positions(self, num_slots: int) -> torch.Tensor:
        """Positions of the first `num_slots` slots in planned order (a chunked prefill's part, or
        the prompt and its output tokens)."""
        planned, slots, cached = self._positions
        if planned is self.planned and slots == num_slots:
            return cached
        natural = self.shape.natural_positions(max(num_slots, self.size))
        if self.planned is None or not self.planned.reuses:
            out = natural[:num_slots]
        else:
            index = self.planned.slot_index
            if num_slots > self.size:
                index = torch.cat([index, torch.arange(self.size, num_slots)])
            out = natural[index][:num_slots]
        self._positions = (self.planned, num_slots, out)
        return out

    def masked(self, token_ids: Sequence[int]) -> array[int]:
        """The radix-tree key of `token_ids` (planned order): planner.Planned.key. A waiting request's match
        asks the same ids of the same plan round after round: the last key is kept (a copy is returned)."""
        planned, ids, key = self._masked
        if planned is self.planned and type(ids) is type(token_ids) and ids == token_ids:
            return key[:]
        positions = self.positions(len(token_ids))
        if self.planned is None:
            key = Planned.natural_key(token_ids, positions)
        else:
            key = self.planned.key(token_ids, positions)
        if type(token_ids) in (list, array):  # a snapshot: the caller's list may change after
            self._masked = (self.planned, token_ids[:], key[:])
        return key

    def real_slots(self, start: int, end: int) -> int:
        """Non-pad slots among planned prompt slots [start, end)."""
        planned, before = self._real_before
        if planned is not self.planned or before is None:  # once per plan, for every range asked of it
            before = [0] + torch.cumsum(self.positions(self.size) != NO_POSITION, 0).tolist()
            self._real_before = (self.planned, before)
        start, end = max(0, min(start, self.size)), max(0, min(end, self.size))
        return before[end] - before[start] if end > start else 0


class Linker:
    """Makes a request's Link the first time the scheduler sees it (the prefill round's hold-back, else
    its match): the hint decoded once, or the layout of a compile row this scheduler made; the chunk
    keys in the request's cache namespace. Later calls return the Link it has."""

    def __init__(self, placement: Placement, page_size: int, model_fingerprint: str) -> None:
        self.placement, self.page_size, self.model_fingerprint = placement, page_size, model_fingerprint
        self._owners = itertools.count(1)

    def link(self, req: Req) -> Link | None:
        link = link_of(req)
        if link is None:
            chunks: tuple[tuple[int, int], ...]
            pads: tuple[tuple[int, int], ...]
            made = layout_of(req)  # a compile row this scheduler made
            if made is not None:
                chunks, pads, compile = (made.chunk,), made.pads, True
            else:
                h = decode_laid_out(getattr(req, "kv_hints", None))
                if h is None:
                    return None
                pads = cast(tuple[tuple[int, int], ...], h.pads)  # laid out: pads given
                chunks, compile = h.chunks, False
            natural = array("q", req.origin_input_ids)
            if any(end > len(natural) for _, end in chunks) or any(s + n > len(natural) for s, n in pads):
                # SGLang replaced the ids of a request it refused (an invalid grammar, say) by one token:
                # it is not laid out as its hint says, and is only streamed its error.
                return None
            # The tenant's namespace and the chunk keys, by the one rule the DP controller routes by too
            # (wire/chunk_keys.py): a client's extra_key or cache_salt never spells another tenant's namespace.
            namespace = cache_namespace(getattr(req, "extra_key", None), getattr(req, "cache_salt", None),
                                        getattr(req, "lora_id", None))
            keys = chunk_keys(natural, chunks, pads, self.placement, self.page_size, self.model_fingerprint, namespace)
            link = attach(req, Link(Shape(natural, tuple(pads), tuple(chunks), keys, compile, next(self._owners))))
        return link
