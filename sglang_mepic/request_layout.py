"""The padded layout a chunked request carries to the scheduler, and what it implies there.

With the mepic attention backend, a request with chunks is sent to the scheduler
already laid out in slots: pad slots hold `PAD_FILL_ID` (any valid id: the
model embeds it, attention never sees it) and the `mepic.chunks` kv_hints
action lists the pad runs. From them the scheduler side derives each slot's
position (for the position map) and the radix-tree key (pads as `PAD_ID`, so a
pad can never match a real token).
"""

from dataclasses import dataclass

import torch

from sglang_mepic.markup import HINT_TYPE
from sglang_mepic.segments import NO_POSITION, PAD_ID

PAD_FILL_ID = 0


@dataclass(frozen=True)
class Hints:
    pads: list[tuple[int, int]]    # (first slot, count) of each pad run
    chunks: list[tuple[int, int]]  # [start, end) slots of each chunk segment, page-aligned
    compile: bool                  # the request is the standalone compile of its one chunk
    compiles: tuple = ()           # rid of the compile sent for each chunk segment (None: none sent)


def hints(kv_hints) -> Hints | None:
    """The layout a request was sent with (None: not laid out in slots)."""
    for action in kv_hints.actions if kv_hints is not None else []:
        if action.action_type == HINT_TYPE and "pads" in action.payload:
            p = action.payload
            return Hints([(int(a), int(b)) for a, b in p["pads"]], [(int(a), int(b)) for a, b in p.get("chunks", [])],
                         bool(p.get("compile", False)), tuple(str(r) if r else None for r in p.get("compiles", ())))
    return None


def pad_runs(kv_hints) -> list[tuple[int, int]]:
    h = hints(kv_hints)
    return h.pads if h is not None else []


def pad_mask(num_slots: int, runs) -> torch.Tensor:
    mask = torch.zeros(num_slots, dtype=torch.bool)
    for start, count in runs:
        mask[start:start + count] = True
    return mask


def slot_positions(num_slots: int, runs) -> torch.Tensor:
    """Real slots count up from 0, pads take NO_POSITION."""
    pads = pad_mask(num_slots, runs)
    positions = torch.cumsum(~pads, 0) - 1
    return torch.where(pads, NO_POSITION, positions)


def masked_key(token_ids, runs):
    """Token ids with every pad slot set to PAD_ID (slots past the layout are generated tokens)."""
    out = list(token_ids)
    for start, count in runs:
        out[start:start + count] = [PAD_ID] * min(count, max(0, len(out) - start))
    return out

