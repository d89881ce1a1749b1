"""The cache-side objects of this scheduler process, for the hooks that SGLang calls without them.

SGLang hands its hooks its own objects (a batch, an allocator), not MEPIC's. What
they need besides is held here: the position map of the attention backend (one
model runner per scheduler process) and the page ownership of each KV allocator
a mepic radix cache counts (see docs/design.md, Ownership).

`current()` is the process's context. `scoped()` swaps in a fresh one for a block
and restores the previous one after, so a test sees only what it set up.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator
from weakref import WeakValueDictionary

if TYPE_CHECKING:
    from sglang_mepic.attention.positions import PositionMap
    from sglang_mepic.pages.ownership import PoolOwnership


@dataclass
class Context:
    positions: PositionMap | None = None  # set by the mepic attention backend; None under any other
    # id(allocator) -> the ownership of its pages. An ownership holds its allocator, so the id
    # names that allocator for as long as the entry lives; the entry goes with the cache that owns it.
    _owners: WeakValueDictionary = field(default_factory=WeakValueDictionary)

    def own(self, owner: PoolOwnership) -> None:
        """Route the frees of `owner.allocator` through `owner` (replacing an earlier owner's)."""
        self._owners[id(owner.allocator)] = owner

    def owner_of(self, allocator) -> PoolOwnership | None:
        return self._owners.get(id(allocator))


_current = Context()


def current() -> Context:
    return _current


@contextmanager
def scoped() -> Iterator[Context]:
    global _current
    outer, _current = _current, Context()
    try:
        yield _current
    finally:
        _current = outer
