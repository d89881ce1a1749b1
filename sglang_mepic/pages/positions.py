"""The per-slot position map: the contract between the scheduler side and the kernels.

`req_to_pos` sits beside SGLang's `req_to_token` and has its shape:

    req_to_token[row, j] = physical KV slot of the request's j-th slot
    req_to_pos[row, j]   = RoPE position of that slot in this request,
                           or NO_POSITION (-1) for a pad slot (masked, no position)

A shared canonical page holds NoPE keys, so it can sit at any j with any
positions. Writers (the scheduler side, when a request gets its row):
- `assign(row, positions)`: a placement plan (chunked requests) sets the whole
  row when the request is admitted; the row is then "planned". Slots past the
  plan (output tokens) follow the plan's last real position.
- `release(row)` for a request without a plan: the row is the identity again.
Readers (the attention backend, every forward, before the model runs):
`on_extend` / `on_decode` return the positions the model must rotate queries
with. An unplanned row's new tokens keep SGLang's positions; a planned row's
take the map's (pads, which the model still embeds, rotate at 0 and stay
masked). They write nothing, so how SGLang batches a token (prefill, decode,
a decode token inside a mixed prefill batch, a CUDA graph's capture) cannot
change where it sits.

CacheBlend also sets `req_to_src`: for each slot, the stored KV slot its keys and
values were copied from into the request's own slot when it was allocated
(-1: computed; the stored slot itself is let go then and never read again).
`copies_for_extend` turns that into the copied tokens of a forward.

The map belongs to the `req_to_token` pool whose rows it mirrors: the mepic attention backend makes it
(`attach`) and the scheduler side finds it through the same pool (`of`), the one SGLang object both
are handed; under another attention backend a pool has none.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch

from sglang_mepic.side_table import SideTable
from sglang_mepic.wire.layout import NO_POSITION

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool


class PositionMap:
    """Every row holds a position for every slot, from the moment the map exists: an unplanned
    row is the identity, a planned row its plan's positions and, past them, the positions its
    decoded tokens will take. So a forward's positions are a gather, never a write: the same
    whether a token arrives in a prefill, a decode step, or as one decode token riding in a
    mixed prefill batch (`--enable-mixed-chunk`), and nothing a forward does (a CUDA graph's
    capture included) touches a row a live request owns. Sizes come from the tensors' shapes
    and which rows are planned (or hold copies) is mirrored on the host, so no per-batch call
    syncs with the device (`tests/attention/test_host_syncs.py` runs them on the meta device, where any
    read of a value raises); CacheBlend's batches are the one exception (`copies_for_extend`)."""

    def __init__(self, req_to_token: torch.Tensor) -> None:
        rows, width = req_to_token.shape
        device = req_to_token.device
        self._identity = torch.arange(width, dtype=torch.int32, device=device)
        self.req_to_pos = self._identity.repeat(rows, 1)
        self.planned = torch.zeros(rows, dtype=torch.bool, device=device)
        self.copies = torch.zeros(rows, dtype=torch.bool, device=device)
        self.req_to_src: torch.Tensor | None = None  # allocated on first use
        # Host mirrors of `planned` and `copies`: release and the per-batch calls ask them, not the device.
        self._planned_rows: set[int] = set()
        self._copy_rows: set[int] = set()

    def assign(self, row: int, positions: torch.Tensor, sources: Sequence[int] | None = None) -> None:
        """The plan's positions for the row's first slots; the slots after them (output tokens not
        yet decoded) follow the plan's last real position, as decode will place them. Device ops
        only: a plan handed over on the device (as `cache/extend` does) costs no host sync, and one
        on the host is copied without blocking."""
        device = self.req_to_pos.device
        n = positions.numel()
        positions = positions.to(device=device, dtype=self.req_to_pos.dtype, non_blocking=True)
        self.req_to_pos[row, :n] = positions
        if n:  # the last real position + 1, as a device scalar: no .item()
            self.req_to_pos[row, n:] = self._identity[n:] + (positions.max() + (1 - n))
        else:
            self.req_to_pos[row, n:] = self._identity[n:]
        self.planned[row] = True
        self._planned_rows.add(row)
        self.copies[row] = sources is not None
        if sources is not None:
            self._copy_rows.add(row)
            if self.req_to_src is None:
                self.req_to_src = torch.full(self.req_to_pos.shape, -1, dtype=torch.int64, device=device)
            src = torch.as_tensor(sources, dtype=torch.int64).to(device, non_blocking=True)
            self.req_to_src[row] = -1
            self.req_to_src[row, :src.numel()] = src
        else:
            self._copy_rows.discard(row)

    def release(self, row: int) -> None:
        """The row serves a request without a plan: the identity again (written only if it was planned)."""
        if row in self._planned_rows:
            self.req_to_pos[row] = self._identity
            self.planned[row] = False
            self._planned_rows.discard(row)
        if row in self._copy_rows:
            self.copies[row] = False
            self._copy_rows.discard(row)

    def _extend_slots(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                      total: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, slot) of each of a forward's `total` extend tokens; device ops of known size only."""
        elen = extend_lens.long()
        r = torch.repeat_interleave(rows, elen, output_size=total)
        starts = torch.repeat_interleave(torch.cumsum(elen, 0) - elen, elen, output_size=total)
        j = (torch.arange(total, device=rows.device) - starts
             + torch.repeat_interleave(prefix_lens.long(), elen, output_size=total))
        return r, j

    def any_planned(self, rows_cpu: torch.Tensor | Iterable[int] | None = None) -> bool:
        """Whether any row is planned, or any of these (a host tensor or list, e.g. a batch's
        `req_pool_indices_cpu`): the host mirror's answer, no device read."""
        if not self._planned_rows or rows_cpu is None:
            return bool(self._planned_rows)
        rows = rows_cpu.tolist() if isinstance(rows_cpu, torch.Tensor) else rows_cpu
        return not self._planned_rows.isdisjoint(rows)

    def copies_for_extend(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                          total: int | None = None, rows_cpu: torch.Tensor | Iterable[int] | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(index among the forward's extend tokens, batch index) of the tokens whose slots hold copied KV.
        None at once, from the host mirror, when no row holds copies (every mode but the private-copy
        baselines) or, given the batch's rows on the host (`rows_cpu`), none of its rows does. A batch with
        such rows (CacheBlend's) reads the device to pick them: that baseline selects tokens on the host."""
        if self.req_to_src is None or not self._copy_rows:
            return None
        if rows_cpu is not None:
            rows_host = rows_cpu.tolist() if isinstance(rows_cpu, torch.Tensor) else rows_cpu
            if self._copy_rows.isdisjoint(rows_host):
                return None
        rows = rows.long()
        if not bool(self.copies[rows].any()):
            return None
        total = int(extend_lens.sum()) if total is None else total
        r, j = self._extend_slots(rows, prefix_lens, extend_lens, total)
        batch = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), extend_lens.long(),
                                        output_size=total)
        src = self.req_to_src[r, j]
        keep = (src >= 0) & self.copies[r]
        if not bool(keep.any()):
            return None
        return torch.nonzero(keep).flatten(), batch[keep]

    def on_extend(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                  positions: torch.Tensor, rows_cpu: torch.Tensor | Iterable[int] | None = None) -> torch.Tensor:
        """Positions of an extend's new tokens: a planned row's from its map row (pads rotate at 0
        and stay masked), SGLang's for the others. A decode token in a mixed batch is an extend of
        one token at its row's next slot, which the plan already placed. SGLang's own tensor when no
        row is planned, or (given the batch's rows on the host, `rows_cpu`) none of the batch's: a host
        branch on_decode may not take, but an extend's metadata is always prepared eagerly (SGLang's
        breakable prefill runner calls the backend's replay hook outside its graph), never captured."""
        if not self.any_planned(rows_cpu):
            return positions
        rows = rows.long()
        r, j = self._extend_slots(rows, prefix_lens, extend_lens, positions.shape[0])
        planned_pos = self.req_to_pos[r, j].to(positions.dtype).clamp(min=0)
        return torch.where(self.planned[r], planned_pos, positions)

    def on_decode(self, rows: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Positions of a decode step's new tokens (the slot seq_len - 1 of each row). No host branch:
        SGLang may capture this call into a graph (SGLANG_ENABLE_METADATA_GLUE_GRAPH) and replay it
        whatever rows are planned then."""
        rows = rows.long()
        planned_pos = self.req_to_pos[rows, seq_lens.long() - 1].to(positions.dtype)
        return torch.where(self.planned[rows], planned_pos, positions)


_MAPS: SideTable[PositionMap] = SideTable("position map of a req_to_token pool")


def attach(req_to_token_pool: ReqToTokenPool) -> PositionMap:
    """The pool's map, made now (by the mepic attention backend, as its model runner starts)."""
    position_map = PositionMap(req_to_token_pool.req_to_token)
    _MAPS.set(req_to_token_pool, position_map)
    return position_map


def of(req_to_token_pool: ReqToTokenPool) -> PositionMap | None:
    """The pool's map; None where no mepic attention backend reads this pool."""
    return _MAPS.get(req_to_token_pool)
