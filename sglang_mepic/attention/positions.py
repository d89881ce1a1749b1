"""The per-slot position map: the contract between the scheduler side and the kernels.

`req_to_pos` sits beside SGLang's `req_to_token` and has its shape:

    req_to_token[row, j] = physical KV slot of the request's j-th slot
    req_to_pos[row, j]   = RoPE position of that slot in this request,
                           or NO_POSITION (-1) for a pad slot (masked, no position)

A shared canonical page holds NoPE keys, so it can sit at any j with any
positions. Writers:
- `assign(row, positions)`: a placement plan (chunked requests) sets the whole
  row when the request is admitted; the row is then "planned".
- `on_extend` / `on_decode` (the attention backend, every forward, before the
  model runs): they return the positions the model must rotate queries with.
  An unplanned row is the identity (every request without chunks): its new
  tokens keep SGLang's positions. A planned row's new tokens take the plan's
  positions (pads, which the model still embeds, rotate at 0 and stay masked),
  and a decoded token follows the row's last real position.
- `release(row)` for a request without a plan, so a reused row is unplanned.

CacheBlend also sets `req_to_src`: for each slot, the stored KV slot its keys and
values were copied from into the request's own slot when it was allocated
(-1: computed; the stored slot itself is let go then and never read again).
`copies_for_extend` turns that into the copied tokens of a forward.

The map of this process's attention backend is `context.current().positions`,
for the scheduler-side writer.
"""

import torch

from sglang_mepic.wire.segments import NO_POSITION


class PositionMap:
    def __init__(self, req_to_token: torch.Tensor):
        self.req_to_pos = torch.full(req_to_token.shape, NO_POSITION, dtype=torch.int32,
                                     device=req_to_token.device)
        self.planned = torch.zeros(req_to_token.shape[0], dtype=torch.bool, device=req_to_token.device)
        self.copies = torch.zeros(req_to_token.shape[0], dtype=torch.bool, device=req_to_token.device)
        self.req_to_src: torch.Tensor | None = None  # allocated on first use
        # max(req_to_pos[row, :filled]) + 1 over the row's filled slots: where a planned row's next
        # decoded token goes. Kept by assign / on_extend / on_decode, so a decode step reads it
        # without scanning the row or syncing with the host.
        self.next_pos = torch.zeros(req_to_token.shape[0], dtype=torch.int64, device=req_to_token.device)

    def assign(self, row: int, positions: torch.Tensor, sources=None) -> None:
        n = positions.numel()
        self.req_to_pos[row, :n] = positions.to(self.req_to_pos.dtype)
        self.req_to_pos[row, n:] = NO_POSITION
        self.planned[row] = True
        self.next_pos[row] = positions.max().to(torch.int64) + 1 if n else 0
        self.copies[row] = sources is not None
        if sources is not None:
            if self.req_to_src is None:
                self.req_to_src = torch.full(self.req_to_pos.shape, -1, dtype=torch.int64,
                                             device=self.req_to_pos.device)
            src = torch.as_tensor(sources, dtype=torch.int64, device=self.req_to_src.device)
            self.req_to_src[row] = -1
            self.req_to_src[row, :src.numel()] = src

    def release(self, row: int) -> None:
        self.planned[row] = False
        self.copies[row] = False

    def copies_for_extend(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor):
        """(index among the forward's extend tokens, batch index) of the tokens whose slots hold copied KV."""
        rows = rows.long()
        if self.req_to_src is None or not bool(self.copies[rows].any()):
            return None
        elen = extend_lens.long()
        batch = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), elen)
        starts = torch.repeat_interleave(torch.cumsum(elen, 0) - elen, elen)
        j = torch.arange(batch.numel(), device=rows.device) - starts + prefix_lens.long()[batch]
        src = self.req_to_src[rows[batch], j]
        keep = (src >= 0) & self.copies[rows[batch]]
        if not bool(keep.any()):
            return None
        return torch.nonzero(keep).flatten(), batch[keep]

    def on_extend(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                  positions: torch.Tensor) -> torch.Tensor:
        rows = rows.long()
        planned = self.planned[rows]
        # Identity prefix for rows without a plan (vectorised over the whole batch).
        plen = torch.where(planned, 0, prefix_lens.long())
        if int(plen.sum()):
            r = torch.repeat_interleave(rows, plen)
            starts = torch.repeat_interleave(torch.cumsum(plen, 0) - plen, plen)
            j = torch.arange(r.numel(), device=rows.device) - starts
            self.req_to_pos[r, j] = j.to(self.req_to_pos.dtype)
        elen = extend_lens.long()
        r = torch.repeat_interleave(rows, elen)
        starts = torch.repeat_interleave(torch.cumsum(elen, 0) - elen, elen)
        j = torch.arange(r.numel(), device=rows.device) - starts + torch.repeat_interleave(prefix_lens.long(), elen)
        token_planned = torch.repeat_interleave(planned, elen)
        planned_pos = self.req_to_pos[r, j].to(positions.dtype)
        self.req_to_pos[r, j] = torch.where(token_planned, planned_pos.to(self.req_to_pos.dtype),
                                            positions.to(self.req_to_pos.dtype))
        filled = prefix_lens.long() + elen
        if rows.numel():
            width = int(filled.max())
            inside = torch.arange(width, device=rows.device)[None, :] < filled[:, None]
            self.next_pos[rows] = torch.where(inside, self.req_to_pos[rows, :width].long(), -1).amax(1) + 1
        return torch.where(token_planned, planned_pos.clamp(min=0), positions)

    def on_decode(self, rows: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Positions of a decode step's new tokens; device ops only (no host sync: the overlap scheduler)."""
        rows, last = rows.long(), seq_lens.long() - 1
        # A planned row's new token follows its last real position (pads have none).
        positions = torch.where(self.planned[rows], self.next_pos[rows].to(positions.dtype), positions)
        self.req_to_pos[rows, last] = positions.to(self.req_to_pos.dtype)
        self.next_pos[rows] = positions.to(torch.int64) + 1
        return positions
