"""Whether a waiting request's chunks are ready for it to be planned this round (scheduler side).

A chunk a request reads may be on its way:
- its compile row (compile_rows.py) runs over several forwards (chunked prefill):
  a reader in one of them would read pages not yet written; in EPIC and CacheBlend,
  which copy stored KV before their forward, a row not done at all;
- its entry is being read from shared storage (tiers/prefetch.py): planned now,
  the request would compute the chunk instead.

Such a request sits the round out (`prefill_round.hold_back`). Asking starts the
storage reads of its missing chunks, so that they overlap the rounds it waits;
planning it later (residency.py) only copies what was fetched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterable

from sglang_mepic.cache.compile_rows import CompileRows
from sglang_mepic.pages.chunk_store import ChunkStore
from sglang_mepic.tiers.levels import PENDING, Tiers

if TYPE_CHECKING:
    from sglang_mepic.cache.link import Link
    from sglang_mepic.cache.shape import Shape


class Readiness:
    """keeps(start, end): whether the store keeps pages of a chunk over those slots;
    canonical_slots(start, end): how many KV slots its stored pages hold (residency.py)."""

    def __init__(self, *, rows: CompileRows, store: ChunkStore, tiers: Tiers, shares: bool,
                 keeps: Callable[[int, int], bool], canonical_slots: Callable[[int, int], int]) -> None:
        self.rows, self.store, self.tiers, self.shares = rows, store, tiers, shares
        self.keeps, self.canonical_slots = keeps, canonical_slots

    def must_wait(self, link: Link) -> bool:
        """Whether the linked request waits for one of its chunks (and, unless a compile row
        holds it back, the storage reads of its missing chunks are started)."""
        if not link.compile and self.rows.running and any(map(self._being_computed, link.keys)):
            return True
        return self.tiers.prefetch is not None and self._being_read(link.shape)

    def _being_computed(self, key: str) -> bool:
        """A compile row of the chunk runs and its pages cannot be read yet: not stored, and
        either not whole in a launched forward or in a mode that copies before its forward."""
        return key in self.rows.running and key not in self.store \
            and not (self.shares and self.rows.in_flight(key))

    def missing(self, links: Iterable[Link]) -> list[tuple[str, int]]:
        """(key, canonical KV slots) of each chunk these requests read that the store lacks and a tier
        below could give, once each, in queue order: what the TP ranks agree on before a round
        (`Tiers.agree_round`); every rank's store holds the same chunks, so each asks the same list."""
        wanted: dict[str, int] = {}
        for link in links:
            for (start, end), key in zip(link.chunk_slots, link.keys):
                if key not in wanted and self.keeps(start, end) and key not in self.store:
                    wanted[key] = self.canonical_slots(start, end)
        return list(wanted.items())

    def _being_read(self, shape: Shape) -> bool:
        pending = False
        for (start, end), key in zip(shape.chunk_slots, shape.keys):
            if self.keeps(start, end) and key not in self.store:
                pending |= self.tiers.want(key, self.canonical_slots(start, end)) == PENDING
        return pending
