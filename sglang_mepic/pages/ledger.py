"""The pages an eviction of everything evictable would free, kept as holders change.

SGLang asks the cache several times per scheduling step how much it could evict
(admission budget, pool observer, metrics). Recounting means walking the whole
tree and store; the ledger instead keeps the answer up to date, at a cost that
follows the pages whose holders changed: holders report changes as they happen
(`touch`, `nodes_hold`, `nodes_let_go`, `chunk_changed`) and the ledger settles
the touched pages when it is next asked (or when an eviction ends: `settle`). A page
whose last holder let go (`gone`) is settled at once: nothing holds it, so it is
neither pinned nor freeable, and the next caller does not pay for the pages an
eviction or a free returned. Which pages are freeable, and why: docs/design.md,
Ownership.
"""

from collections import Counter
from collections.abc import Iterable
from typing import cast

from sglang_mepic.pages.chunk_store import Chunk, ChunkStore
from sglang_mepic.pages.refs import PageRefs


class Ledger:
    def __init__(self, refs: PageRefs, store: ChunkStore) -> None:
        self.refs = refs
        self.store = store
        self.loose: Counter[int] = Counter()   # page -> unlocked tree nodes holding it
        self._pinned: set[int] = set()    # held pages that something other than nodes and chunks holds
        self._chunk_pins: dict[str, int] = {}  # chunk -> its pages in _pinned
        self._free: set[int] = set()      # freeable pages
        self._dirty: set[int] = set()

    # ---- what holders report ------------------------------------------------

    def touch(self, pages: Iterable[int]) -> None:
        self._dirty.update(pages)

    def nodes_hold(self, pages: list[int]) -> None:
        """Unlocked tree nodes took these pages (a new node, or a node unlocked)."""
        self.loose.update(pages)
        self._dirty.update(pages)

    def nodes_let_go(self, pages: list[int]) -> None:
        """Unlocked tree nodes gave up these pages (deleted, or locked)."""
        loose = self.loose
        for p in pages:
            n = loose[p] - 1
            if n:
                loose[p] = n
            else:
                del loose[p]
        self._dirty.update(pages)

    def chunk_changed(self, key: str, pages: tuple[int, ...], stored: bool) -> None:
        if stored:
            self._chunk_pins[key] = sum(1 for p in pages if p in self._pinned)
        else:
            del self._chunk_pins[key]
        self._dirty.update(pages)

    def gone(self, pages: list[int]) -> None:
        """These pages' last holder let go (`PageRefs.on_gone`): they go back to the allocator.

        A page no unlocked tree node and no stored chunk holds any more is neither pinned nor
        freeable; it is settled here, as `_settle` would settle it (no chunk holds it: no chunk's
        pins change), and is no longer among the pages to settle. One that a node or a chunk has
        not yet reported letting go stays among them (the evictions report first)."""
        loose, page_keys = self.loose, self.store.page_keys()
        dirty, pinned, free = self._dirty, self._pinned, self._free
        for p in pages:
            if p in loose or p in page_keys:
                continue
            dirty.discard(p)
            pinned.discard(p)
            free.discard(p)

    def clear(self) -> None:
        """Forget everything (the tree, the store and the pool are being cleared)."""
        self.loose.clear()
        self._pinned.clear()
        self._chunk_pins.clear()
        self._free.clear()
        self._dirty.clear()

    # ---- what the cache asks --------------------------------------------------

    def freeable(self) -> int:
        self._settle()
        return len(self._free)

    def freeable_pages(self) -> set[int]:
        """The pages themselves (a copy): the page anatomy's evictable ones."""
        self._settle()
        return set(self._free)

    def chunk_loose(self, chunk: Chunk) -> bool:
        """Whether no page of the chunk is pinned (it goes once the unlocked tree has)."""
        self._settle()
        return self._chunk_pins[chunk.key] == 0

    def settle(self) -> None:
        """Settle the pages touched since the last question now (an eviction ends: its pages
        are its own cost, not the next caller's)."""
        self._settle()

    def _settle(self) -> None:
        if not self._dirty:
            return
        count, loose, pinned, chunk_pins = self.refs.count, self.loose, self._pinned, self._chunk_pins
        page_keys, none = self.store.page_keys(), ()
        recheck = self._dirty
        self._dirty = set()
        flipped: list[str] = []
        for p in recheck:
            keys = page_keys.get(p, none)
            kept = loose.get(p, 0) + len(keys)
            now = kept > 0 and count(p) > kept
            if now != (p in pinned):
                if now:
                    pinned.add(p)
                else:
                    pinned.discard(p)
                step = 1 if now else -1
                for key in keys:
                    before = chunk_pins[key]
                    chunk_pins[key] = before + step
                    if before == 0 or before + step == 0:  # the chunk's evictability flipped
                        flipped.append(key)
        store = self.store
        for key in flipped:
            recheck.update(cast(tuple[int, ...], store.peek(key)))  # a key of a page it holds: stored
        free = self._free
        for p in recheck:
            keys = page_keys.get(p, none)
            if (p not in pinned and loose.get(p, 0) + len(keys) > 0
                    and all(chunk_pins[k] == 0 for k in keys)):
                free.add(p)
            else:
                free.discard(p)
