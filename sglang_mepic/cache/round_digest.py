"""A digest of one prefill round's plan, compared across the TP ranks (`SGLANG_MEPIC_CHECK_RANKS=1`).

Under tensor parallelism every rank must plan each round alike: the same requests held back, the same
chunks loaded or computed, the same page ids and compile rows (docs/scale-out.md). A rank that parts
from the others does not fail by itself: its forwards pair with theirs and answer wrongly, or a later
collective hangs. With the check on, each rank hashes what its round planned and the ranks compare the
hashes (`Agreement.check_same`, one all-gather a round): a divergence is one log line naming the round
and the ranks, then an error that ends the server. It is a debugging aid and the TP tests' witness; off
(the default) nothing is hashed or sent, and at TP 1 nothing either way.

What is hashed: the round's agreed tier answers, the requests held back, and for each request of the
batch its rid (not a compile row's, which each rank draws), planned ids, prefix and extend lengths, chunk
keys, where each chunk was found, the reused slots injected after the tree's match, the store's pages
for its chunks and the compile rows it waits on; then the free pages and the chunks stored.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import TYPE_CHECKING, Any, Iterable

from sglang_mepic.cache.link import link_of

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch

    from sglang_mepic.cache.radix_cache import MepicRadixCache


def digest(tree: MepicRadixCache, batch: ScheduleBatch | None, held: Iterable[Req], agreed: dict[str, str]) -> bytes:
    """The round's plan as this rank made it (see the module's docstring)."""
    h = hashlib.sha256()

    def add(*parts: Any) -> None:
        h.update(repr(parts).encode())
        h.update(b"\0")

    add("agreed", list(agreed.items()))
    add("held", [str(req.rid) for req in held])
    for req in batch.reqs if batch is not None else ():
        link = link_of(req)
        h.update(array("q", req.origin_input_ids).tobytes())
        # A compile row's rid is drawn per rank (compile_rows.py): its ids and chunk key name it instead.
        rid = "compile row" if link is not None and link.compile else str(req.rid)
        add(rid, len(req.output_ids), req.prefix_len, req.extend_len)
        if link is None:
            continue
        injected = link.injected.tolist() if link.injected is not None else None
        add(link.keys, link.found, injected, [tree.store.peek(key) for key in link.keys],
            sorted(link.compiling), link.compile)
    add("pool", tree.pages.available(), len(tree.store))
    return h.digest()


def check(tree: MepicRadixCache, batch: ScheduleBatch | None, held: Iterable[Req], agreed: dict[str, str]) -> None:
    """Compare this round's plan with the other ranks' (raises `RanksDiverged` where they differ); nothing at
    TP 1."""
    if tree.tiers.agreement.alone:
        return
    tree.tiers.agreement.check_same(digest(tree, batch, held, agreed))
