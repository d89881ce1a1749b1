"""The mepic radix cache with chunks, on SGLang's real paged allocator and RadixCache,
without a server: prefix matching through chunk nodes, reuse through the store,
tenant isolation, and page ownership from admission to flush."""

import pytest
import torch

from sglang_mepic.plan import Source
from sglang_mepic.segments import Kind, Piece, Placement, layout

B = 16
NUM_PAGES = 64


@pytest.fixture(scope="module", autouse=True)
def hooks():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mepic import plugin

    plugin.register()
    HookRegistry.apply_hooks()


@pytest.fixture
def tree():
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from sglang_mepic.radix_cache import MepicRadixCache

    allocator = PagedTokenToKVPoolAllocator(NUM_PAGES * B, B, torch.float32, "cpu", None, False)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                             page_size=B)
    return MepicRadixCache(params, model_fingerprint="tiny")


def request(*chunks, prompt=(1, 2, 3), question=(9, 8, 7, 6)):
    pieces = [Piece(Kind.PROMPT, prompt)] + [Piece(Kind.CHUNK, c) for c in chunks] + [Piece(Kind.PROMPT, question)]
    return layout(pieces, B, Placement.TRAILING)


C1 = tuple(range(100, 140))  # 40 tokens: 3 pages, 2 of them canonical
C2 = tuple(range(200, 250))  # 50 tokens: 4 pages, 3 canonical


def serve(tree, lay, namespace=None):
    """What the scheduler does for one chunked request, minus the model: plan, allocate,
    publish compiled chunks, cache the row in the tree, release the unaligned tail."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams, MatchPrefixParams

    plan = tree.plan(lay, namespace)
    prefix = tree.match_prefix(MatchPrefixParams(key=tree.key_for(lay, namespace)))
    prefix_pages = (tree.path_device_indices(prefix.last_device_node)[::B] // B).tolist()
    row, compiled = [], {}
    for i, page in enumerate(plan.pages):
        if page.source is Source.PREFIX:
            row.append(prefix_pages[i])
        elif page.source is Source.SHARED:
            row.append(page.page)
        else:
            (new,) = tree.refs.alloc(1)
            row.append(new)
            if page.source is Source.COMPILE:
                compiled.setdefault(page.chunk, []).append(new)
    for key, pages in compiled.items():
        assert tree.publish(key, pages) == tuple(pages)
    full_pages = lay.size // B
    tree.insert(InsertParams(key=tree.key_for(lay, namespace), value=tree.pages.slots(row[:full_pages])))
    tree.refs.release(row[full_pages:])  # the partial last page is not cached
    return plan, row


def sources(plan):
    return [p.source for p in plan.pages]


def test_identical_request_matches_all_the_way(tree):
    lay = request(C1, C2)
    first, row = serve(tree, lay)
    assert first.count(Source.COMPILE) == 2 + 3 and first.count(Source.SHARED) == 0
    again, row2 = serve(tree, lay)
    # Prompt, both first blocks and all canonical pages come from the tree; only the
    # unaligned question page is computed again.
    assert sources(again) == [Source.PREFIX] * (len(again.pages) - 1) + [Source.COMPUTE]
    assert row2[:-1] == row[:-1]


def test_reordered_chunks_resolve_through_the_store(tree):
    _, row_a = serve(tree, request(C1, C2))
    plan, row_c = serve(tree, request(C2, C1, question=(5, 5)))
    # prompt page from the tree; each chunk's first block recomputed; canonical pages shared.
    assert sources(plan) == [Source.PREFIX,
                             Source.COMPUTE, Source.SHARED, Source.SHARED, Source.SHARED,
                             Source.COMPUTE, Source.SHARED, Source.SHARED,
                             Source.COMPUTE]
    canonical_a = {*row_a[2:4], *row_a[5:8]}  # C1 pages 1-2, C2 pages 1-3 in the first request
    assert set(p.page for p in plan.pages if p.source is Source.SHARED) == canonical_a
    assert set(row_c[2:5]) == set(row_a[5:8]) and set(row_c[6:8]) == set(row_a[2:4])
    # Each canonical page has three holders: the store and both requests' tree paths.
    assert {tree.refs.count(p) for p in canonical_a} == {3}
    assert tree.refs.shared() == len(canonical_a)
    assert tree.store.stats.hits == 2


def test_namespaces_never_share(tree):
    _, row_a = serve(tree, request(C1), namespace="tenant-a")
    plan, row_b = serve(tree, request(C1), namespace="tenant-b")
    assert Source.SHARED not in sources(plan) and Source.PREFIX not in sources(plan)
    assert not set(row_a[:-1]) & set(row_b[:-1])  # the last, partial pages were freed and reused


def test_pages_return_to_the_pool_after_eviction_and_flush(tree):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    start = tree.pages.available()
    serve(tree, request(C1, C2))
    serve(tree, request(C2, C1, question=(4,)))
    serve(tree, request(C1, C2))
    canonical = tree.store.canonical_pages()
    assert canonical == 5
    assert tree.pages.available() < start - canonical
    tree.evict(EvictParams(num_tokens=NUM_PAGES * B))
    # The tree let go; the store still holds the canonical pages, and nothing else is in use.
    assert tree.pages.available() == start - canonical
    assert tree.store.flush() == canonical
    assert tree.pages.available() == start
    assert tree.refs.shared() == 0


def test_store_holds_pages_the_tree_evicted_and_reuses_them(tree):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    _, row_a = serve(tree, request(C1))
    tree.evict(EvictParams(num_tokens=NUM_PAGES * B))
    plan, row_b = serve(tree, request(C1, prompt=(7, 7)))
    assert [p.page for p in plan.pages if p.source is Source.SHARED] == row_a[2:4]
