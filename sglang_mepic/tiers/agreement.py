"""What the TP ranks decided each on its own, made one decision: a MIN over the ranks, once per round.

Under tensor parallelism every rank runs the same scheduler on the same requests, and its mepic cache
plans, compiles and evicts as the others do (docs/scale-out.md). The tiers below the device pool break
that: a storage read that times out on one rank only, an outage, an absence remembered since, a host pool
sized against one rank's free memory. A rank that loads a chunk another computes pairs different page ids
and tree keys with the others' collectives. SGLang's HiCache makes its ranks agree by a MIN all-reduce of
what each found, once per round, over the TP CPU group (`UnifiedRadixCache._all_reduce`,
`pool_host/base.py::sync_fixed_hicache_size`); this is the same for the mepic tiers:
- `min_codes`: one all-reduce of one code per chunk a round asks about (tiers/levels.py), so a chunk is
  loaded only where every rank has it ready;
- `min_int`: one number, the host pool's size, at start;
- `check_same`: a digest of each round's plan gathered from every rank and compared
  (`SGLANG_MEPIC_CHECK_RANKS=1`): a divergence is one log line naming the round and the ranks, then an error.

At TP 1 (or with no TP group: tests, tools) nothing is sent: every call returns its input, no collective.
The group is SGLang's TP CPU group (gloo), as HiCache uses it: the scheduler's tensors stay off the device.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch

logger = logging.getLogger(__name__)


class RanksDiverged(RuntimeError):
    """The TP ranks planned a round differently (`check_same`)."""


class Agreement:
    """The TP ranks' MIN over what each decided alone; a no-op for one rank."""

    def __init__(self, group: Any = None, size: int = 1, rank: int = 0, dist: Any = None):
        """`group`: the TP CPU group, `size` and `rank` this process's in it; `dist`: what runs the
        collectives (torch.distributed; a test's stand-in)."""
        self.group, self.size, self.rank = group, size, rank
        self._dist = dist if dist is not None else torch.distributed
        self.collectives = 0  # collectives this process has run (tests: none at TP 1)
        self.rounds = 0       # rounds checked by check_same

    @classmethod
    def of_group(cls, group: Any) -> "Agreement":
        """The agreement over SGLang's TP CPU group (`CacheInitParams.tp_cache_group`); alone where there is
        none, or torch.distributed is not set up."""
        dist = torch.distributed
        if group is None or not dist.is_available() or not dist.is_initialized():
            return cls()
        return cls(group, dist.get_world_size(group=group), dist.get_rank(group=group))

    @property
    def alone(self) -> bool:
        return self.size <= 1

    def min_codes(self, codes: Sequence[int]) -> list[int]:
        """Each position's lowest code over the ranks: one all-reduce, none at TP 1 or for no codes. Every
        rank must ask with as many codes, in the same order (the same chunks: the ranks' stores agree)."""
        return self._min(codes, torch.int32)

    def min_int(self, value: int) -> int:
        """The lowest of the ranks' values (one all-reduce; none at TP 1)."""
        return self._min([value], torch.int64)[0]

    def _min(self, values: Sequence[int], dtype: torch.dtype) -> list[int]:
        if self.alone or not values:
            return list(values)
        tensor = torch.tensor(list(values), dtype=dtype)
        self._dist.all_reduce(tensor, op=self._dist.ReduceOp.MIN, group=self.group)
        self.collectives += 1
        return [int(v) for v in tensor.tolist()]

    def check_same(self, digest: bytes) -> None:
        """Compare this round's plan digest with every rank's (one all-gather; none at TP 1). Raises
        RanksDiverged, after one error line naming the round and each rank's digest, where they differ."""
        self.rounds += 1
        if self.alone:
            return
        mine = torch.tensor([self.rounds, int.from_bytes(digest[:7], "big")], dtype=torch.int64)
        gathered = [torch.zeros_like(mine) for _ in range(self.size)]
        self._dist.all_gather(gathered, mine, group=self.group)
        self.collectives += 1
        seen = [(int(t[0]), int(t[1])) for t in gathered]
        if len(set(seen)) == 1:
            return
        ranks = ", ".join(f"rank {r}: round {n} plan {d:014x}" for r, (n, d) in enumerate(seen))
        logger.error("MEPIC rank check: round %d: the TP ranks planned differently (%s); this rank is %d",
                     self.rounds, ranks, self.rank)
        raise RanksDiverged(f"round {self.rounds}: the TP ranks planned differently ({ranks})")
