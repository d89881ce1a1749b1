"""A request's shape: what its hint and namespace fix (natural slot order, pads, chunk segments and their
keys), the same at every match. Its own module so that the planner and the compile rows, which read it, and the
linker, which makes it, do not import each other."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from functools import cached_property

import torch

from sglang_mepic.cache.plan import ChunkSpan
from sglang_mepic.wire.layout import NO_POSITION
from sglang_mepic.wire.slots import masked_key, pad_mask, slot_positions


@dataclass(frozen=True, eq=False)
class Shape:
    """What the request's hint and namespace fix: the same at every match."""

    natural: array                      # prompt token ids in natural slot order
    pads: tuple[tuple[int, int], ...]   # (first slot, count) in natural order
    chunk_slots: tuple[tuple[int, int], ...]  # [start, end) of each chunk segment
    keys: tuple[str, ...]               # chunk key of each chunk segment (layout.span_hash)
    compile: bool                       # a compile row: one chunk computed standalone (compile_rows.py)
    owner: int = 0                      # unique per request: EPIC's and CacheBlend's private tree keys

    @property
    def size(self) -> int:
        return len(self.natural)

    def spans(self) -> list[ChunkSpan]:
        return [ChunkSpan(s, e, k) for (s, e), k in zip(self.chunk_slots, self.keys)]

    @cached_property
    def _prompt_positions(self) -> torch.Tensor:
        return slot_positions(self.size, self.pads)

    @cached_property
    def pad_count(self) -> int:
        return sum(count for _, count in self.pads)

    def pads_within(self, slots: int) -> int:
        """The pads that lie wholly within the first `slots` slots (output_report: asked at each streamed output)."""
        if slots >= self.size:
            return self.pad_count
        return sum(count for start, count in self.pads if start + count <= slots)

    def natural_positions(self, num_slots: int) -> torch.Tensor:
        """Positions of the request's slots in natural order (output slots follow the prompt)."""
        prompt = self._prompt_positions
        if num_slots <= self.size:
            return prompt[:num_slots]
        real = self.size - self.pad_count
        return torch.cat([prompt, torch.arange(real, real + num_slots - self.size, dtype=prompt.dtype)])

    @cached_property
    def pad_masked(self) -> array:
        """The prompt's ids in natural order with pads as PAD_ID: the key of every unplanned match (the
        waiting queue's sort asks it of each request, round after round)."""
        return array("q", masked_key(self.natural, self.pads))

    @cached_property
    def _ids(self) -> torch.Tensor:
        return torch.frombuffer(self.natural, dtype=torch.int64) if self.natural else torch.zeros(0, dtype=torch.int64)

    def ids_in(self, index: torch.Tensor) -> array:
        """The prompt's ids at natural slots `index` (a planned order)."""
        return array("q", self._ids[index].numpy().tobytes())

    def pad_slots(self) -> list[bool]:
        """Whether each natural prompt slot is a pad."""
        return pad_mask(self.size, self.pads).tolist()

    def real_per_page(self, page_size: int) -> list[int]:
        """Real (non-pad) slots of each natural page of the prompt."""
        real = (self._prompt_positions != NO_POSITION).to(torch.int32)
        pages = -(-self.size // page_size)
        return torch.nn.functional.pad(real, (0, pages * page_size - self.size)).view(pages, page_size).sum(1).tolist()
