"""The per-slot position map: the contract between the scheduler side and the kernels.

`req_to_pos` sits beside SGLang's `req_to_token` and has its shape:

    req_to_token[row, j] = physical KV slot of the request's j-th slot
    req_to_pos[row, j]   = RoPE position of that slot in this request,
                           or NO_POSITION (-1) for a pad slot (masked, no position)

A shared canonical page holds NoPE keys, so it can sit at any j with any
positions. Writers:
- `assign(row, positions)`: a placement plan (chunked requests) sets the whole
  row when the request is admitted; the row is then "planned".
- `on_extend` / `on_decode` (the attention backend, every forward): new tokens
  take the positions the model rotated their queries with; the prefix of an
  unplanned row is the identity, which is what every request without chunks has.
- `release(row)` when the request leaves, so the row is unplanned again.
"""

import torch

from sglang_mepic.segments import NO_POSITION


class PositionMap:
    def __init__(self, req_to_token: torch.Tensor):
        self.req_to_pos = torch.full(req_to_token.shape, NO_POSITION, dtype=torch.int32,
                                     device=req_to_token.device)
        self.planned = torch.zeros(req_to_token.shape[0], dtype=torch.bool, device=req_to_token.device)

    def assign(self, row: int, positions: torch.Tensor) -> None:
        n = positions.numel()
        self.req_to_pos[row, :n] = positions.to(self.req_to_pos.dtype)
        self.req_to_pos[row, n:] = NO_POSITION
        self.planned[row] = True

    def release(self, row: int) -> None:
        self.planned[row] = False

    def on_extend(self, rows: torch.Tensor, prefix_lens: torch.Tensor, extend_lens: torch.Tensor,
                  positions: torch.Tensor) -> None:
        rows = rows.long()
        unplanned = ~self.planned[rows]
        # Identity prefix for rows without a plan (vectorised over the whole batch).
        plen = torch.where(unplanned, prefix_lens.long(), 0)
        if int(plen.sum()):
            r = torch.repeat_interleave(rows, plen)
            starts = torch.repeat_interleave(torch.cumsum(plen, 0) - plen, plen)
            j = torch.arange(r.numel(), device=rows.device) - starts
            self.req_to_pos[r, j] = j.to(self.req_to_pos.dtype)
        elen = extend_lens.long()
        r = torch.repeat_interleave(rows, elen)
        starts = torch.repeat_interleave(torch.cumsum(elen, 0) - elen, elen)
        j = torch.arange(r.numel(), device=rows.device) - starts + torch.repeat_interleave(prefix_lens.long(), elen)
        self.req_to_pos[r, j] = positions.to(self.req_to_pos.dtype)

    def on_decode(self, rows: torch.Tensor, seq_lens: torch.Tensor, positions: torch.Tensor) -> None:
        self.req_to_pos[rows.long(), seq_lens.long() - 1] = positions.to(self.req_to_pos.dtype)
