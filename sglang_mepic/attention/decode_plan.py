"""The torch path's plan of a decode step, found once for every layer of the forward.

A row whose new token has the largest position in it sees every real slot, so its keys and values can grow
by one slot a step (`reference.DecodeKV`, seeded by the extend before it). A row with a slot positioned past
its new token (a plan that put a later chunk before an earlier one's continuation) masks by position and
reads its context afresh (`reference.attend_paged`)."""

from __future__ import annotations

import torch

from sglang_mepic.attention.reference import DecodeRows


def plan_decode(rows: list[int], seq_lens: list[int], plain_rows: list[bool], req_to_token: torch.Tensor,
                req_to_pos: torch.Tensor, new_positions: torch.Tensor) -> tuple[DecodeRows, list[int]]:
    """(the rows that read `DecodeKV`, the indices in the batch of the others). rows, seq_lens, plain_rows:
    the batch's, on the host (plain: no placement plan, slot j at position j); new_positions: each row's new
    token's position."""
    new = new_positions.tolist()
    cached: list[int] = []
    general: list[int] = []
    for i, (row, seq_len, plain) in enumerate(zip(rows, seq_lens, plain_rows)):
        if plain or int(req_to_pos[row, :seq_len].max()) <= new[i]:
            cached.append(i)
        else:
            general.append(i)
    cached_rows = [rows[i] for i in cached]
    cached_lens = [seq_lens[i] for i in cached]
    index = torch.tensor(cached, dtype=torch.long, device=new_positions.device)
    row_index = torch.tensor(cached_rows, dtype=torch.long, device=req_to_token.device)
    last = torch.tensor(cached_lens, dtype=torch.long, device=req_to_token.device) - 1  # long even when empty
    new_slots = req_to_token[row_index, last].long()

    def context(j: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        slots = req_to_token[cached_rows[j], :cached_lens[j]]
        if plain_rows[cached[j]]:
            return slots, None
        kv_pos = req_to_pos[cached_rows[j], :cached_lens[j]]
        real = kv_pos >= 0  # pads (NO_POSITION) are left out
        return slots[real], kv_pos[real]

    return DecodeRows(cached, cached_rows, cached_lens, new_slots, new_positions.index_select(0, index).long(),
                      context), general
