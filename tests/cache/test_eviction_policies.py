"""Every --radix-eviction-policy SGLang offers evicts, in the mepic cache, what SGLang's own
RadixCache evicts (issue 29, defect 6), and an allocator the cache cannot free through is refused.

The mepic cache keeps its eviction heap across calls where a node's priority only grows as it
is used; under `mru` (priority -last_access_time, which falls when a node is used) a kept heap
hid the leaf SGLang evicts. The differential test drives both caches with the same random plain
calls (insert, match, lock, unlock, evict; no chunks) and compares the trees after each call.
"""

import random
from array import array

import pytest
from support.replay import B, apply_hooks, make_tree

# SGLang 0.5.23's policies (sglang.srt.mem_cache.utils._EVICTION_POLICY_FACTORIES) but tlru, which
# only its unified tree supports: its strategy reads node fields the Python RadixCache never sets.
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority", "slru")
NUM_PAGES = 24
RUNS = 12
STEPS = 80


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


def test_policies_listed_are_sglangs():
    from sglang.srt.mem_cache.utils import _EVICTION_POLICY_FACTORIES

    assert set(_EVICTION_POLICY_FACTORIES) == set(POLICIES) | {"tlru"}


def key(ids):
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(array("q", ids))


def insert(tree, ids, priority=0):
    """Cache `ids` as a finished request would: fresh slots, the duplicates of what the tree
    already held given back."""
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams

    allocator = tree.token_to_kv_pool_allocator
    slots = allocator.alloc(len(ids))
    assert slots is not None
    result = tree.insert(InsertParams(key=key(ids), value=slots, priority=priority))
    if result.prefix_len:
        allocator.free(slots[:result.prefix_len])


def match(tree, ids):
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams

    return tree.match_prefix(MatchPrefixParams(key=key(ids))).last_device_node


def evict(tree, pages):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    return tree.evict(EvictParams(num_tokens=pages * B)).num_tokens_evicted


def contents(tree) -> dict:
    """Every node by the tokens of its path from the root: its lock count."""
    out, stack = {}, [(child, ()) for child in tree.root_node.children.values()]
    while stack:
        node, above = stack.pop()
        path = above + tuple(node.key.token_ids)
        out[path] = node.lock_ref
        stack.extend((child, path) for child in node.children.values())
    return out


def test_mru_evicts_the_most_recently_used_leaf():
    """The issue's case: insert A, insert B, use A, evict one page: MRU drops A, keeps B."""
    a, b = [1] * B, [2] * B
    kept = []
    for sglang in (True, False):
        tree = make_tree(num_pages=NUM_PAGES, sglang=sglang, eviction_policy="mru")
        insert(tree, a)
        insert(tree, b)
        match(tree, a)
        assert evict(tree, 1) == B
        kept.append(set(contents(tree)))
    assert kept[0] == kept[1] == {tuple(b)}


@pytest.mark.parametrize("policy", POLICIES)
def test_eviction_matches_sglang(policy):
    pages = [[t] * (B // 2) + [t + 1] * (B // 2) for t in (1, 3, 5)]  # shared prefixes by construction
    for run in range(RUNS):
        rng = random.Random(f"{policy}-{run}")
        trees = [make_tree(num_pages=NUM_PAGES, sglang=True, eviction_policy=policy),
                 make_tree(num_pages=NUM_PAGES, eviction_policy=policy)]
        locks = []  # per lock: the node locked in each tree
        for step in range(STEPS):
            ids = [t for _ in range(rng.randint(1, 4)) for t in rng.choice(pages)]
            op = rng.choices(["insert", "match", "evict", "lock", "unlock"], [4, 4, 2, 1, 1])[0]
            if op == "insert" and trees[0].token_to_kv_pool_allocator.available_size() < 4 * B:
                op = "evict"
            if op == "unlock" and not locks:
                op = "match"
            if op == "lock" and len(locks) >= 3:
                op = "unlock"
            if op == "insert":
                priority = rng.randint(0, 2)
                for tree in trees:
                    insert(tree, ids, priority)
            elif op == "match":
                for tree in trees:
                    match(tree, ids)
            elif op == "evict":
                n = rng.randint(1, 6)
                evicted = [evict(tree, n) for tree in trees]
                assert evicted[0] == evicted[1], (policy, run, step, evicted)
            elif op == "lock":
                locks.append([tree.lock(match(tree, ids)) for tree in trees])
            else:
                for tree, lock in zip(trees, locks.pop(rng.randrange(len(locks)))):
                    tree.unlock(lock)
            sglang, mepic = trees
            assert contents(mepic) == contents(sglang), (policy, run, step, op)
            assert (mepic.token_to_kv_pool_allocator.available_size()
                    == sglang.token_to_kv_pool_allocator.available_size()), (policy, run, step, op)
            assert mepic.evictable_size() == sglang.evictable_size(), (policy, run, step, op)


def test_an_allocator_that_overrides_its_frees_is_refused():
    """SGLang's PageInterleavePoolAllocator frees through its own free_segment (per owner class);
    the cache frees whole pages with free_page_ids, so it would bypass it: refused when built."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator

    from sglang_mepic.pages.pool_pages import FREE_PATH, check_allocator

    assert "free_segment" in vars(PageInterleavePoolAllocator)
    allocator = make_tree(num_pages=NUM_PAGES).token_to_kv_pool_allocator
    check_allocator(allocator)  # SGLang's paged allocator, hooked as the plugin hooks it: accepted

    class OwnFreeSegment(PagedTokenToKVPoolAllocator):
        def free_segment(self, free_index, *, start_pos):
            self.free(free_index)

    allocator.__class__ = OwnFreeSegment
    with pytest.raises(ValueError, match="free_segment"):
        check_allocator(allocator)
    allocator.__class__ = PageInterleavePoolAllocator
    with pytest.raises(ValueError, match="PageInterleavePoolAllocator.*free_segment"):
        check_allocator(allocator)
    with pytest.raises(ValueError, match="paged KV allocator"):
        check_allocator(object())
    assert set(FREE_PATH) >= {"free", "free_page_ids", "free_segment"}


def test_the_cache_refuses_such_an_allocator_when_built():
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.page_interleave import PageInterleavePoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    from sglang_mepic.cache.radix_cache import MepicRadixCache

    class Interleaved(PagedTokenToKVPoolAllocator):
        free_segment = PageInterleavePoolAllocator.free_segment

    tree = make_tree(num_pages=NUM_PAGES)
    allocator = tree.token_to_kv_pool_allocator
    allocator.__class__ = Interleaved
    params = CacheInitParams(disable=False, req_to_token_pool=tree.req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=B)
    with pytest.raises(ValueError, match="Interleaved.*free_segment"):
        MepicRadixCache(params, model_fingerprint="tiny")
