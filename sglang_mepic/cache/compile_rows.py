"""Chunks computed in the forward that needs them (scheduler side).

A chunk that no tier holds is computed standalone (positions from 0, attending
only to itself, after the model's BOS with `--mepic-compile-sink bos`): its
*canonical* KV, which every later request reuses. The scheduler makes that
computation a row of its own, a *compile row*, and adds it to the prefill batch
of the first request that reads the chunk, right before it (patch
`schedule_policy_add_one_req`). No request is sent anywhere: the row is made
here, never reaches the tokenizer side, and ends with its forward.

Within one forward every layer writes the KV of every row before any row's
attention reads it (`backend.forward_extend`), so the reader, planned with the
chunk's canonical pages as part of its prefix, reads in the same layer the KV
the compile row has just written. Its plan holds a placeholder for those pages
until SGLang has allocated the batch; then the reader's KV row is pointed at the
pages the compile row writes (`readers.py`). Cost: the chunk's tokens once,
plus its first block in the reader's context, in one prefill round.

Readers planned in the same round share one compile row of a chunk, and so do
readers planned while its batch is in flight (SGLang's overlap scheduler plans
the next batch before it processes this one's results): forwards run in order,
so a later batch reads pages an earlier one wrote (`in_flight`). A batch whose
forward raised has its compile rows dropped before the next batch is planned
(hardening/batch_guard.py), so nothing reads what they never wrote.

A compile row that SGLang splits over several forwards (a chunk longer than the
chunked prefill budget) cannot be read by a row of its first forward: its
readers wait until it has run whole and its pages are stored (held back from
the round, `prefill_round.hold_back`), as does a reader in a mode that copies
stored KV before its forward (EPIC, CacheBlend: a copy of pages not yet
computed would be garbage).

Row lifecycle: `pending` (made this round, for the readers planned in it;
dropped at the round's end unless SGLang admitted it) -> `running` (it has KV
pages; until it is released; readable once its whole chunk has pages) ->
released, its canonical pages stored (`MepicRadixCache._publish`).
"""

from __future__ import annotations

import dataclasses
import uuid
from array import array
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch

from sglang_mepic.side_table import SideTable
from sglang_mepic.wire.slots import PAD_FILL_ID

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

    from sglang_mepic.cache.shape import Shape

# The layout (a `CompileLayout`) of each compile row a scheduler made. Only this module adds to
# it, for Req objects it makes: nothing a client sends can make a row a compile.
LAYOUTS: SideTable[CompileLayout] = SideTable("mepic compile rows")

# Placeholder page of a chunk whose compile row is in the reader's own batch, until the batch
# is allocated. Page 0 is SGLang's padding page, never handed out; the reader's row is pointed
# at the compile row's pages before its forward (`readers.py`).
PLACEHOLDER_PAGE = 0


@dataclass(frozen=True)
class CompileLayout:
    """A compile row's slots: [sink page][the chunk, padded as in any request][one pad slot].

    The last pad slot: SGLang always computes at least a request's last slot, and a pad there
    lets the tree match every page of a compiled chunk.
    """

    ids: tuple[int, ...]
    chunk: tuple[int, int]                 # [start, end) of the chunk's slots
    pads: tuple[tuple[int, int], ...]      # (first slot, count) of each pad run
    key: str = ""                          # the chunk's key (as the reader's plan names it)


def layout(chunk_ids: Sequence[int], chunk_pads: Iterable[tuple[int, int]], page_size: int,
           sink: int | None) -> CompileLayout:
    """The compile row of a chunk whose padded slots hold `chunk_ids` (pads as any id) with pad
    runs `chunk_pads` (relative to its first slot)."""
    head = [] if sink is None else [sink] + [PAD_FILL_ID] * (page_size - 1)
    at, size = len(head), len(chunk_ids)
    runs = ([(1, page_size - 1)] if head and page_size > 1 else []) + \
        [(at + s, n) for s, n in chunk_pads] + [(at + size, 1)]
    merged: list[list[int]] = []
    for s, n in runs:
        if merged and merged[-1][0] + merged[-1][1] == s:
            merged[-1][1] += n
        else:
            merged.append([s, n])
    ids = head + [PAD_FILL_ID if i < 0 else int(i) for i in chunk_ids] + [PAD_FILL_ID]
    return CompileLayout(tuple(ids), (at, at + size), tuple((s, n) for s, n in merged))


def chunk_layout(shape: Shape, index: int, page_size: int, sink: int | None) -> CompileLayout:
    """The compile row of chunk segment `index` of a laid-out request (shape.Shape)."""
    start, end = shape.chunk_slots[index]
    pads = [(max(s, start) - start, min(s + n, end) - max(s, start)) for s, n in shape.pads
            if s < end and s + n > start]
    return layout(shape.natural[start:end], pads, page_size, sink)


def layout_of(row: Req) -> CompileLayout | None:
    """The row's compile layout; None: not a compile row."""
    return LAYOUTS.get(row)


def is_compile_row(req: Req) -> bool:
    return req in LAYOUTS


class CompileRows:
    """The compile rows of one scheduler: made on demand, shared within a round, tracked until released.

    make_req(rid, ids, parent) -> Req: a request SGLang can schedule, in the parent's cache
    namespace (extra_key, cache_salt, LoRA), greedy, generating nothing.
    """

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        # set by the scheduler's prefill round (prefill_round.py)
        self.make_req: Callable[[str, array[int], Req], Req] | None = None
        # adder -> request rows it may still fill (prefill_round.py)
        self.rows_left: Callable[[PrefillAdder], int] | None = None
        self.sink: int | None = None
        self.pending: dict[str, Req] = {}   # chunk key -> row made this round, not admitted
        # chunk key -> (row admitted, not released; its canonical pages once its whole chunk has them)
        self.running: dict[str, tuple[Req, tuple[int, ...] | None]] = {}
        self.made = 0                          # rows SGLang admitted (cumulative): chunks computed

    def for_chunk(self, parent: Req, shape: Shape, index: int) -> Req | None:
        """The compile row of chunk segment `index` of `parent`, made once per round and chunk;
        None when this process cannot make one (a cache driven without a scheduler)."""
        key = shape.keys[index]
        row = self.pending.get(key)
        if row is None and self.make_req is not None:
            lay = dataclasses.replace(chunk_layout(shape, index, self.page_size, self.sink), key=key)
            row = self.make_req(f"mepic-compile-{uuid.uuid4().hex}", array("q", lay.ids), parent)
            LAYOUTS.set(row, lay)
            self.pending[key] = row
        return row

    def admitted(self, row: Req, key: str, pages: tuple[int, ...] | None) -> None:
        """SGLang has allocated the row's pages for this forward; `pages`: its canonical pages
        once its whole chunk has them (None while chunked prefill has parts of it to come)."""
        if self.pending.get(key) is row:
            del self.pending[key]
        if key not in self.running or self.running[key][0] is not row:
            self.made += 1  # counted once, when SGLang first allocates it
        self.running[key] = (row, pages)

    def in_flight(self, key: str) -> tuple[int, ...] | None:
        """The canonical pages of a running compile row of `key` whose whole chunk is in a forward
        already launched: a request in a later batch reads them (forwards run in order)."""
        entry = self.running.get(key)
        return entry[1] if entry is not None else None

    def failed(self, row: Req) -> None:
        """The row's forward raised: its pages hold nothing; no later request may read them."""
        for key, (running, _) in list(self.running.items()):
            if running is row:
                self.running[key] = (row, None)

    def released(self, row: Req, key: str) -> None:
        if key in self.running and self.running[key][0] is row:
            del self.running[key]

    def forget_finished(self) -> None:
        """Drop rows that ended without being released here: an aborted row (abort_all, a client's
        abort of the request it was made for) may be finished on a path that never hands its KV back
        through the cache, and a reader waiting for its chunk would wait for ever. The chunk, not
        stored, is then computed by a new row for whoever reads it next."""
        for key, (row, _) in list(self.running.items()):
            if row.finished() or not getattr(row.kv, "holds_kv", True):  # ended, or SGLang took its KV row back
                del self.running[key]

    def end_round(self) -> None:
        """Rows made this round that SGLang did not admit are dropped: they hold nothing."""
        self.pending.clear()

    def reset(self) -> None:
        self.pending.clear()
        self.running.clear()


def canonical_slots(row: Req, req_to_token: torch.Tensor, page_size: int, canonical_from: int) -> torch.Tensor:
    """The KV slots of a compile row's canonical pages (its chunk's pages from `canonical_from` on)."""
    start, end = cast(CompileLayout, LAYOUTS.get(row)).chunk  # asked only of a compile row
    return req_to_token[row.kv.req_pool_idx, start + canonical_from * page_size:end]
