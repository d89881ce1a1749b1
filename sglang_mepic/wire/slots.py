"""The padded layout a chunked request carries to the scheduler, and what it implies there.

With the mepic attention backend, a request with chunks is sent to the scheduler
already laid out in slots: pad slots hold `PAD_FILL_ID` (any valid id: the
model embeds it, attention never sees it) and the `mepic.chunks` kv_hints
action (hint.py) lists the pad runs. From them the scheduler side derives each slot's
position (for the position map) and the radix-tree key (pads as `PAD_ID`, so a
pad can never match a real token).
"""

from typing import Iterable, Sequence

import torch

from sglang_mepic.wire.layout import NO_POSITION, PAD_ID

PAD_FILL_ID = 0


def pad_mask(num_slots: int, runs: Iterable[tuple[int, int]]) -> torch.Tensor:
    mask = torch.zeros(num_slots, dtype=torch.bool)
    for start, count in runs:
        mask[start:start + count] = True
    return mask


def slot_positions(num_slots: int, runs: Iterable[tuple[int, int]]) -> torch.Tensor:
    """Real slots count up from 0, pads take NO_POSITION."""
    pads = pad_mask(num_slots, runs)
    positions = torch.cumsum(~pads, 0) - 1
    return torch.where(pads, NO_POSITION, positions)


def masked_key(token_ids: Iterable[int], runs: Iterable[tuple[int, int]]) -> list[int]:
    """Token ids with every pad slot set to PAD_ID (slots past the layout are generated tokens)."""
    out = list(token_ids)
    for start, count in runs:
        out[start:start + count] = [PAD_ID] * min(count, max(0, len(out) - start))
    return out


def start_slot(slot_tokens: Sequence[int], start: int) -> int:
    """The slot of real token `start` (the slot count for `start` == the number of real tokens)."""
    real = [i for i, t in enumerate(slot_tokens) if t != PAD_ID]
    if start > len(real):
        raise ValueError(f"logprob_start_len={start} is higher than the number of input tokens ({len(real)}); "
                         "use a smaller logprob_start_len")
    return real[start] if start < len(real) else len(slot_tokens)
