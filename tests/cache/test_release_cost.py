"""A request's release costs the same on a small and a large tree (issue 88 item 2).

Releasing a finished request (checkpoint, free of its row's tail, unlock, then the
`evictable_size` SGLang asks next) settles the ledger's touched pages. Its work must
follow the request, not what happened to the pool before it: an eviction of many
pages used to leave them all for the next question to settle, so the first release
after one paid for the whole eviction (eval.bench.cache: release 0.26 ms at 1k cached
pages, 1.1 ms at 100k). Counted here in pages settled, not in time: a count does not
depend on the machine's load.
"""

import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from support.oracle import recount_freeable
from support.replay import B, apply_hooks, chunked, filled, finish, laid_out, planned


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


def settled_by(tree, fn) -> int:
    """Pages the ledger settles while `fn` runs."""
    ledger, settle = tree.ledger, tree.ledger._settle
    seen = []

    def counting():
        seen.append(len(ledger._dirty))
        settle()

    ledger._settle = counting
    try:
        fn()
    finally:
        del ledger._settle
    return sum(seen)


def release_after_eviction(pages: int) -> tuple[int, int]:
    """(pages an eviction of half the tree freed, pages the next request's release settled)."""
    tree, i = filled(pages)
    start = tree.refs.freed
    tree.evict(EvictParams(num_tokens=pages // 2 * B))
    evicted = tree.refs.freed - start
    lay = chunked(i, [2 * i - 4, 2 * i - 3, 2 * i - 2, 2 * i - 1])  # the last request's chunks, stored
    req = planned(tree, *laid_out(lay))

    def release():
        finish(tree, req)
        tree.evictable_size()

    settled = settled_by(tree, release)
    assert tree.ledger.freeable() == len(recount_freeable(tree))  # the ledger is still exact
    return evicted, settled


def test_release_settles_what_the_request_touched_whatever_the_pool():
    small_evicted, small = release_after_eviction(200)
    large_evicted, large = release_after_eviction(2000)
    request_pages = -(-chunked(0, range(4)).size // B)
    assert large_evicted > 10 * request_pages, large_evicted  # an eviction far larger than the request
    # The request's own pages (its row, the chunks it read, the nodes it locked), not the eviction's:
    assert small <= 2 * request_pages and large <= 2 * request_pages, (small, large, request_pages)
    assert large <= small + 4, (small, large)


def test_an_eviction_leaves_no_page_to_settle():
    """The pages an eviction freed or touched are settled by it (its cost, not the next caller's)."""
    tree, _ = filled(400)
    tree.evict(EvictParams(num_tokens=200 * B))
    assert settled_by(tree, tree.evictable_size) == 0
    assert tree.ledger.freeable() == len(recount_freeable(tree))
