"""Chunk affinity: which data-parallel replica a request goes to, by bounded-load consistent hashing.

Each DP replica has its own scheduler and its own mepic cache, so a chunk is compiled on every replica that a
request carrying it reaches. SGLang's round robin sends the requests that share a chunk to every replica in
turn, and each replica compiles it. This router sends a request to a replica that holds its chunks, under a
bound on load:

1. Preference. Each replica scores the request's chunk slots it holds (it was sent a request carrying that
   chunk). Where no replica holds any of them, each chunk gives its slots to its rendezvous (highest random
   weight) home among the active replicas: distinct chunks spread evenly, each always to the same replica,
   and a replica leaving moves only the chunks homed on it. A chunk first seen beside held ones gets no vote
   of its own: it goes with its request, so chunks asked together are compiled together, on one replica.
   Ties, and the order after the first, go by the rendezvous order of the request's largest chunk.
2. The bound (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded Loads", SODA 2018): a
   replica takes the request only while its requests in flight are below ceil((1 + eps) * (F + 1) / n), F the
   requests in flight over the n active replicas; else the next replica in preference order takes it. The
   least loaded replica always is below (it has at most floor(F / n)), so no replica is sent a request while
   it runs (1 + eps) times the mean or more, whatever the chunks. eps = 0.25, HAProxy's default balance factor
   for the same rule (`hash-balance-factor 125`): affinity holds until a replica runs a quarter more than the
   mean; a smaller eps moves more requests off their chunks' replica (the paper bounds the moves a request
   causes by O(1/eps^2)), a larger one lets a hot chunk's replica queue more.
3. A request with no chunk (unmarked, or with a hint the tokenizer did not seal: request_chunks.py) goes to
   the least loaded replica, ties taken in turn.

Tenants: a chunk's key holds its tenant's namespace (wire/chunk_keys.py), and what the router remembers is per
key, so a tenant's preference depends only on its own chunks and where its own requests went. Another
tenant's requests change only the loads, as they would under any balancer.

What a replica holds is what this router sent it, not what its cache still holds: a replica that evicted a
chunk compiles it again when asked, as it would under any rule. The router remembers the last `memory` keys
it saw; a key it forgot is placed as a new one.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

EPS = 0.25
MEMORY = 1 << 16  # keys remembered: 65,536 of about 100 bytes each


@dataclass(frozen=True)
class Chunk:
    key: str    # the cache's chunk key (wire/chunk_keys.chunk_keys): tokens, model and tenant's namespace
    slots: int  # slots it takes, pads included: what a replica that lacks it computes


def weight(key: str, replica: int) -> int:
    """The chunk's rendezvous weight on a replica: its home is the active replica of the highest weight."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest(), "big")


def home(key: str, replicas: Sequence[int]) -> int:
    return max(replicas, key=lambda replica: weight(key, replica))


def load_bound(in_flight: int, replicas: int, eps: float = EPS) -> int:
    """A replica takes a request only while it runs fewer requests than this."""
    return math.ceil((1 + eps) * (in_flight + 1) / replicas)


class AffinityRouter:
    """Where each request goes (`choose`), and which replicas each chunk key was sent to."""

    def __init__(self, eps: float = EPS, memory: int = MEMORY) -> None:
        if eps <= 0 or memory < 1:
            raise ValueError(f"eps {eps} must be above 0 and memory {memory} at least 1")
        self.eps, self.memory = eps, memory
        self._held: OrderedDict[str, frozenset[int]] = OrderedDict()  # least recently sent first
        self._turn = 0  # the next tie of least loaded replicas goes to the one this many places on

    def holders(self, key: str) -> frozenset[int]:
        return self._held.get(key, frozenset())

    def preference(self, chunks: Sequence[Chunk], replicas: Sequence[int]) -> list[int]:
        """The active replicas, the one this request's chunks prefer first (rule 1)."""
        held = dict.fromkeys(replicas, 0)
        for chunk in chunks:
            for replica in self.holders(chunk.key):
                if replica in held:
                    held[replica] += chunk.slots
        if not any(held.values()):  # nothing of it held anywhere: each chunk votes for its home
            for chunk in chunks:
                held[home(chunk.key, replicas)] += chunk.slots
        lead = max(chunks, key=lambda chunk: (chunk.slots, chunk.key)).key
        return sorted(replicas, key=lambda replica: (-held[replica], -weight(lead, replica)))

    def choose(self, chunks: Sequence[Chunk], replicas: Sequence[int], loads: Mapping[int, int]) -> int:
        """The replica this request goes to, remembered as holding its chunks from now on.

        replicas: the active ones (ids); loads[replica]: its requests in flight, this one not counted."""
        if not replicas:
            raise ValueError("no active replica to route to")
        if not chunks:
            return self.least_loaded(replicas, loads)
        bound = load_bound(sum(loads[replica] for replica in replicas), len(replicas), self.eps)
        preferred = self.preference(chunks, replicas)
        # The least loaded replica is always below the bound (rule 2), so one of them takes it.
        chosen = next(replica for replica in preferred if loads[replica] < bound)
        self.record(chunks, chosen)
        return chosen

    def record(self, chunks: Sequence[Chunk], replica: int) -> None:
        """`replica` was sent these chunks (by this router, or by the client's own `routed_dp_rank`)."""
        for key in dict.fromkeys(chunk.key for chunk in chunks):
            self._held[key] = self._held.pop(key, frozenset()) | {replica}
        while len(self._held) > self.memory:
            self._held.popitem(last=False)

    def least_loaded(self, replicas: Sequence[int], loads: Mapping[int, int]) -> int:
        fewest = min(loads[replica] for replica in replicas)
        tied = [replica for replica in replicas if loads[replica] == fewest]
        chosen = tied[self._turn % len(tied)]
        self._turn += 1
        return chosen
