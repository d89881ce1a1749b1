"""The radix tree's evictable leaves in SGLang's eviction order, without a heap per call.

SGLang's `evict` heapifies every evictable leaf on each call: a cost that grows
with the tree, paid at every eviction. Under the strategies whose priority of a
node never falls as it is used (access time, hit count, the max'd request
priority) or never changes (creation time), one heap kept across calls stays in
SGLang's order: a leaf is pushed when it becomes evictable, and entries that
went stale are skipped or pushed again when popped. Under the others (mru:
-access time; tlru; any other) each call builds SGLang's own heap.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sglang.srt.mem_cache.evict_policy import (FIFOStrategy, FILOStrategy, LFUStrategy, LRUStrategy,
                                               PriorityStrategy, SLRUStrategy)

if TYPE_CHECKING:
    from sglang.srt.mem_cache.radix_cache import RadixCache, TreeNode

KEPT_HEAP_STRATEGIES = (LRUStrategy, LFUStrategy, FIFOStrategy, FILOStrategy, PriorityStrategy, SLRUStrategy)


class Leaves:
    def __init__(self, tree: RadixCache) -> None:
        self.tree = tree  # its `evictable_leaves` and `eviction_strategy`
        self._heap: list[tuple[Any, int, TreeNode]] = []  # (priority, push order, node)
        self._pushed = 0  # ties: push order

    @property
    def kept(self) -> bool:
        """Whether the heap is kept across calls, or built per call."""
        return type(self.tree.eviction_strategy) in KEPT_HEAP_STRATEGIES

    def became_evictable(self, node: TreeNode) -> None:
        if self.kept:
            self._pushed += 1
            heapq.heappush(self._heap, (self.tree.eviction_strategy.get_priority(node), self._pushed, node))

    def clear(self) -> None:
        self._heap, self._pushed = [], 0

    def in_order(self) -> Iterator[TreeNode]:
        """Evictable leaves, first to evict first; the caller deletes each leaf it takes, and a
        parent that deletion leaves a leaf comes in at its priority."""
        return iter(self._next, None) if self.kept else self._by_call()

    def _next(self) -> TreeNode | None:
        """The evictable leaf SGLang's heap would pop first, or None.

        Entries go stale: the node was locked, got children or was deleted (skipped), or was
        used since it was pushed (pushed again at its new priority; priorities only grow).
        """
        heap, evictable, strategy = self._heap, self.tree.evictable_leaves, self.tree.eviction_strategy
        if len(heap) > 2 * len(evictable) + 1024:  # mostly stale: start over
            heap[:] = [(strategy.get_priority(n), i, n) for i, n in enumerate(evictable)]
            heapq.heapify(heap)
            self._pushed = len(heap)
        while heap:
            priority, _, node = heapq.heappop(heap)
            if node not in evictable:
                continue
            now = strategy.get_priority(node)
            if now != priority:
                self._pushed += 1
                heapq.heappush(heap, (now, self._pushed, node))
                continue
            return node
        return None

    def _by_call(self) -> Iterator[TreeNode]:
        """SGLang's own heap for this call, of (priority, node) pairs (ties: TreeNode's order)."""
        tree, strategy = self.tree, self.tree.eviction_strategy
        heap = [(strategy.get_priority(n), n) for n in tree.evictable_leaves]
        heapq.heapify(heap)
        while heap:
            _, node = heapq.heappop(heap)
            if node not in tree.evictable_leaves:
                continue
            yield node
            parent = node.parent
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (strategy.get_priority(parent), parent))
