"""What the mepic cache keeps up to date, counted from scratch: the tests' oracles."""

from collections import Counter

import torch


def tree_holders(tree) -> dict[int, int]:
    """Page -> number of unlocked tree nodes holding it (a walk of the whole tree)."""
    values = []
    stack = list(tree.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node.lock_ref == 0 and node.value is not None and len(node.value):
            values.append(node.value[::tree.page_size])
    if not values:
        return {}
    pages, counts = torch.unique(torch.cat(values).div(tree.page_size, rounding_mode="floor"), return_counts=True)
    return dict(zip(pages.tolist(), counts.tolist()))


def recount_freeable(tree) -> set[int]:
    """Pages that evicting every unlocked tree node and every unheld chunk would free, counted
    over the whole tree and store: the ledger's answer (`tree.ledger.freeable()`), from scratch.

    A page is pinned when something other than an unlocked tree node or a stored chunk holds it
    (a request, a locked node). A chunk with no pinned page is evicted once the tree's unlocked
    nodes are gone; its pages are freed when every chunk that shares them is evicted too.
    """
    holders = tree_holders(tree)
    refs, store = tree.refs, tree.store
    free = {p for p, n in holders.items() if refs.count(p) == n}
    loose = Counter()  # page -> evictable chunks holding it
    for pages in store.chunks():
        if all(refs.count(p) == holders.get(p, 0) + store.holding(p) for p in pages):
            loose.update(pages)
    free.update(p for p, n in loose.items() if n == store.holding(p))
    return free
