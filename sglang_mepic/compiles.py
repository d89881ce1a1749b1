"""Which requests wait for the chunk compiles sent for them (scheduler side; the tokenizer
side, which sends them, is chunk_compiles.py).

The tokenizer side sends each chunk of a request alone as a compile request and,
right behind them on the same socket, the request itself, naming the compile
sent for each of its chunks (`compiles` in its hints). A chunk the store
already holds needs nothing more: the request is planned in the same round as
its compiles (which cost one token each), so a request whose chunks are all
resident costs no more scheduling rounds than a plain one. A request whose
chunk is not stored while the compile for it is queued or running waits, out
of SGLang's sight, until that compile is released and its pages are stored.

A compile that never runs (aborted, or failed before it was sent) is neither
queued nor running, so nothing waits on it: the chunk is computed in context.

The scheduler often receives a request's compiles a moment before the request
(they are sent first, and it wakes on the first message). Run then, they take a
prefill round of their own ahead of the request, and a forward's fixed cost is
large (about 0.1 s on SmolLM2 on CPU, every position-independent system's lead
"before the queue" over vanilla in eval.run). So a compile waits for a request
that names it, for at most `grace` seconds (a request that was aborted on the
way must not keep its compiles back).
"""

import time
from collections import OrderedDict
from typing import Callable, Iterable

# Where each recent compile found its chunk, by rid: a request's compiles run before it
# is admitted, and requests are sent right behind theirs, so a bounded memory suffices.
KEEP = 1 << 16
# How long a compile waits for the request it was sent for (it arrives milliseconds behind).
GRACE = 0.05


class Compiles:
    def __init__(self, keep: int = KEEP, grace: float = GRACE):
        self.running: set[str] = set()  # admitted, not released
        self.found: OrderedDict[str, str] = OrderedDict()
        self.keep, self.grace = keep, grace

    def admitted(self, rid: str, where: str) -> None:
        self.running.add(rid)
        self.found[rid] = where
        if len(self.found) > self.keep:
            self.found.popitem(last=False)

    def released(self, rid: str) -> None:
        self.running.discard(rid)

    def waiting(self, links: Iterable, stored: Callable[[str], bool]) -> list:
        """The (req, link) pairs, of those given in queue order, that must wait.

        A request waits while a chunk of it is not `stored` and the compile sent for it is
        queued (among the links given) or running. A compile waits, `grace` seconds at most
        since it was first seen, while no request given names it.
        """
        links = list(links)
        pending = self.running | {req.rid for req, link in links if link.compile}
        named = {rid for _, link in links if not link.compile for rid in link.compiles if rid}
        now = time.monotonic()
        held = []
        for req, link in links:
            if link.compile:
                link.held_at = now if link.held_at is None else link.held_at
                if req.rid not in named and now - link.held_at < self.grace:
                    held.append((req, link))
                continue
            if not link.compiles:
                continue
            if any(rid in pending and not stored(key) for rid, key in zip(link.compiles, link.keys) if rid):
                link.held_at = now if link.held_at is None else link.held_at
                held.append((req, link))
            elif link.held_at is not None:
                link.waited += now - link.held_at
                link.held_at = None
        return held

    def compiled(self, link) -> tuple[int, ...]:
        """Chunk segments of the request that the compiles sent for it computed (found absent)."""
        return tuple(i for i, rid in enumerate(link.compiles) if rid and self.found.get(rid) == "absent")

    def residency(self, link) -> list[str]:
        """Where each chunk segment was: as its compile found it, else as the request's plan did."""
        planned = link.found or ["absent"] * len(link.keys)
        return [self.found.get(rid or "", where) for rid, where in zip(link.compiles, planned)]
