"""Scheduler-side state of one laid-out request (`req.mepic`).

A request arrives laid out in its natural slot order with the `mepic.chunks`
kv_hints action (request_layout.py). Each time the scheduler matches it, the
radix cache plans it against the chunk store (plan.py) and, in shared modes,
reorders its token ids so the reused pages form the prefix. Once the request is
admitted the plan is fixed until the request releases its row (a retracted
request is planned again from its natural order).
"""

from array import array
from dataclasses import dataclass, field

import torch

from sglang_mepic.plan import ChunkSpan, Plan, arrangement_tag
from sglang_mepic.request_layout import pad_mask, slot_positions
from sglang_mepic.segments import NO_POSITION, PAD_ID


@dataclass
class Link:
    natural: array                      # prompt token ids in natural slot order
    pads: list[tuple[int, int]]         # (first slot, count) in natural order
    chunk_slots: list[tuple[int, int]]  # [start, end) of each chunk segment
    compile: bool                       # a standalone compile of one chunk (issued by the tokenizer side)
    compiles: tuple = ()                # rid of the compile sent for each chunk segment (None: none sent)
    compiled: tuple[int, ...] = ()      # chunk segments those compiles computed (known at admission)
    held_at: float | None = None        # held back for a compile since (time.monotonic; compiles.py)
    waited: float = 0.0                 # seconds it was held back for compiles
    keys: list[str] = field(default_factory=list)
    plan: Plan | None = None
    order: list[int] | None = None      # natural slot of each planned prompt slot (None: natural order)
    sources: list[int] | None = None    # private-copy modes: canonical slot per natural slot, or -1
    injected: torch.Tensor | None = None  # reused KV slots appended to the tree's match
    tree_len: int = 0                   # slots the tree matched before the injected ones
    tree_took: int = 0                  # injected slots the tree has taken its own reference on
    held: list[int] = field(default_factory=list)  # pages this request holds a reference on
    found: list[str] | None = None      # where each chunk was found when planned: device, host, storage, absent
    admitted: bool = False
    owner: int = 0                      # EPIC: whose private copies its planned prefix is (plan.private)
    private_key: int | None = None      # CacheBlend: the key's first id, unique to this request (its KV is blended)
    report: dict = field(default_factory=dict)
    _positions: tuple = (None, -1, None)  # (order, num_slots, positions): match, insert and admit ask alike

    @property
    def size(self) -> int:
        return len(self.natural)

    def spans(self) -> list[ChunkSpan]:
        return [ChunkSpan(s, e, k) for (s, e), k in zip(self.chunk_slots, self.keys)]

    def natural_positions(self, num_slots: int) -> torch.Tensor:
        """Positions of the request's slots in natural order (output slots follow the prompt)."""
        return slot_positions(num_slots, self.pads)

    def positions(self, num_slots: int) -> torch.Tensor:
        """Positions of the first `num_slots` slots in planned order (a chunked prefill's part, or
        the prompt and its output tokens)."""
        order, slots, cached = self._positions
        if order is self.order and slots == num_slots:
            return cached
        natural = self.natural_positions(max(num_slots, self.size))
        if self.order is None:
            out = natural[:num_slots]
        else:
            index = torch.tensor(self.order + list(range(self.size, num_slots)), dtype=torch.long)
            out = natural[index][:num_slots]
        self._positions = (self.order, num_slots, out)
        return out

    def masked(self, token_ids) -> array:
        """The radix-tree key: token ids (planned order) with pad slots as PAD_ID, each reused
        canonical page tagged with its chunk (plan.page_tag), and each computed page after a
        reused one tagged with how many reused pages precede it (plan.arrangement_tag)."""
        out = array("q", token_ids)
        pos = self.positions(len(out))
        for i in torch.nonzero(pos == NO_POSITION).flatten().tolist():
            out[i] = PAD_ID
        if self.private_key is not None and out:
            out[0] = self.private_key
        if self.order is not None:
            plan = self.plan
            page_size = plan.page_size
            pages = -(-len(out) // page_size)
            for k, tag in enumerate(plan.tags[:pages]):
                out[k * page_size] = tag
            for k, before in enumerate(plan.reused_before[:max(0, pages - len(plan.tags))], start=len(plan.tags)):
                if before:
                    out[k * page_size] = arrangement_tag(out[k * page_size], before)
        return out

    def compiled_reuse(self, canonical_from: int, page_size: int) -> int:
        """Real tokens this request reuses from chunks that its own compiles computed.

        They are in the store, so the plan reuses them, but they were computed for
        this request: neither a cache hit nor a recompute in context.
        """
        if self.plan is None or not self.compiled:
            return 0
        natural = self.natural_positions(self.size)
        reused = set(self.plan.order[:len(self.plan.reused)])
        total = 0
        for i in set(self.compiled):
            if i < len(self.chunk_slots):
                start, end = self.chunk_slots[i]
                for page in range(start // page_size + canonical_from, end // page_size):
                    if page in reused:
                        total += int((natural[page * page_size:(page + 1) * page_size] != NO_POSITION).sum())
        return total

    def pad_slots(self) -> list[bool]:
        """Whether each natural prompt slot is a pad."""
        return pad_mask(self.size, self.pads).tolist()

    def real_slots(self, start: int, end: int) -> int:
        """Non-pad slots among planned prompt slots [start, end)."""
        pos = self.positions(self.size)[start:end]
        return int((pos != NO_POSITION).sum())
