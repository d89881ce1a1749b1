"""The index of registered texts (known_texts.py): every namespace's texts by key (anchor ^ the
namespace's salt) in sorted rows, the texts added since the last sort beside them, and two bit tables
that pass about 1 prompt window in 250 by chance. `_Index.matches` finds, all windows at once, where a
namespace's texts match by hash; `_leftmost` takes the non-overlapping leftmost of them, checked
character for character.
"""

from __future__ import annotations

from math import isqrt
from typing import Sequence

import numpy as np

from sglang_mepic.frontend.text_hashes import _Hashes

# Texts of a namespace that may share one start: each is compared wherever the start occurs in a prompt.
MAX_SAME_START = 8
# Bit-table slots a key, in each of the two tables (sized at each merge, for the rows and the texts
# that may be added before the next): about 1 window in 16 passes each by chance.
FILTER_SLOTS = 16
# Texts added since the last sort are sorted in once there are more than this, or than the root of the rows.
MERGE_AT = 64


class _Rows:
    """Index entries as arrays sorted by key: one namespace's texts that share a start lie together,
    apart from every other namespace's. A removed text's row stays, dead, until the next merge."""

    def __init__(self, key: np.ndarray, owner: np.ndarray, length: np.ndarray, full: np.ndarray,
                 text: np.ndarray) -> None:
        order = np.argsort(key, kind="stable")
        self.key, self.owner, self.length, self.full, self.text = (a[order] for a in (key, owner, length, full, text))
        self.alive = np.ones(len(order), dtype=bool)

    @classmethod
    def of(cls, entries: Sequence[tuple[int, int, int, int, str]]) -> "_Rows":
        """Rows of (key, owner, length, full hash, text) tuples."""
        key, owner, length, full, text = zip(*entries) if entries else ((),) * 5
        texts = np.empty(len(text), dtype=object)
        texts[:] = text
        return cls(np.array(key, dtype=np.uint64), np.array(owner, dtype=np.uint64),
                   np.array(length, dtype=np.int64), np.array(full, dtype=np.uint64), texts)

    def __len__(self) -> int:
        return len(self.key)

    def join(self, other: "_Rows") -> "_Rows":
        """The live rows of both, sorted."""
        a, b = self.alive, other.alive
        return _Rows(*(np.concatenate([x[a], y[b]]) for x, y in ((self.key, other.key), (self.owner, other.owner),
                                                                 (self.length, other.length), (self.full, other.full),
                                                                 (self.text, other.text))))

    def spans(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For each key, its first row and how many rows hold it."""
        first = np.searchsorted(self.key, keys, side="left")
        return first, np.searchsorted(self.key, keys, side="right") - first

    def rows_of(self, key: int, owner: int) -> np.ndarray:
        """The live rows of one namespace's key (at most MAX_SAME_START)."""
        first, n = self.spans(np.array([key], dtype=np.uint64))
        rows = np.arange(first[0], first[0] + n[0])
        return rows[self.alive[rows] & (self.owner[rows] == np.uint64(owner))]


class _Index:
    """Every namespace's texts by key (anchor ^ the namespace's salt): sorted rows (`main`), the texts
    added since they were sorted (`recent`, sorted in by `_merge`) and the two bit tables."""

    def __init__(self) -> None:
        self.main = _Rows.of([])
        # (owner, text) -> (key, length, full hash), added since the last merge
        self.recent: dict[tuple[int, str], tuple[int, int, int]] = {}
        self._recent_rows: _Rows | None = None  # `recent` sorted, built when asked for after a change
        self._recent_keys: dict[tuple[int, int], int] = {}  # (owner, key) -> how many of `recent` hold it
        self.dead = 0               # main's rows of removed texts
        self._size_filter()

    def recent_rows(self) -> _Rows:
        if self._recent_rows is None:
            self._recent_rows = _Rows.of([(k, o, n, f, t) for (o, t), (k, n, f) in self.recent.items()])
        return self._recent_rows

    def count(self, key: int, owner: int) -> int:
        """How many texts of the namespace `owner` start with the anchor under `key`."""
        return len(self.main.rows_of(key, owner)) + self._recent_keys.get((owner, key), 0)

    def add(self, owner: int, key: int, full: int, text: str) -> None:
        self.recent[owner, text] = (key, len(text), full)
        self._recent_rows = None
        self._recent_keys[owner, key] = self._recent_keys.get((owner, key), 0) + 1
        mask = len(self.low) - 1
        self.low[key & mask] = self.high[(key >> 40) & mask] = True
        self._merge_if_due()

    def remove(self, owner: int, key: int, text: str) -> None:
        if self.recent.pop((owner, text), None) is not None:
            self._recent_rows = None
            self._recent_keys[owner, key] -= 1
            if not self._recent_keys[owner, key]:
                del self._recent_keys[owner, key]
        else:
            rows = self.main.rows_of(key, owner)
            row = rows[self.main.text[rows] == text][0]
            self.main.alive[row] = False
            self.main.text[row] = None  # the string goes with its charge
            self.dead += 1
        self._merge_if_due()

    def _merge_if_due(self) -> None:
        if len(self.recent) + self.dead > max(MERGE_AT, isqrt(len(self.main))):
            self.main = self.main.join(self.recent_rows())
            self.recent, self._recent_rows, self._recent_keys, self.dead = {}, None, {}, 0
            self._size_filter()

    def _size_filter(self) -> None:
        """Bit tables for the rows and the texts added before the next merge, set from the rows' keys."""
        keys = len(self.main) + max(MERGE_AT, isqrt(len(self.main))) + 1
        size = 1 << min(24, (FILTER_SLOTS * keys - 1).bit_length())
        self.low, self.high = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
        self.low[self.main.key & np.uint64(size - 1)] = True
        self.high[(self.main.key >> np.uint64(40)) & np.uint64(size - 1)] = True

    def matches(self, owner: int, salt: int, hashes: _Hashes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each start in the prompt where a text of the namespace matches by hash, with the longest
        such text and its length: at most MAX_SAME_START array passes over the windows a table passes."""
        keys = hashes.windows() ^ np.uint64(salt)
        mask = np.uint64(len(self.low) - 1)
        starts = np.flatnonzero(self.low[keys & mask] & self.high[(keys >> np.uint64(40)) & mask])
        keys = keys[starts]
        best = np.zeros(len(starts), dtype=np.int64)
        texts = np.empty(len(starts), dtype=object)
        end = len(hashes.prefix) - 1
        for rows in (self.main, self.recent_rows()):
            first, held = rows.spans(keys)
            for j in range(int(held.max(initial=0))):  # one namespace's rows of a key lie together
                at = np.flatnonzero(held > j)
                row = first[at] + j
                length = rows.length[row]
                ok = (rows.alive[row] & (rows.owner[row] == np.uint64(owner)) & (length > best[at])
                      & (starts[at] + length <= end))
                at, row, length = at[ok], row[ok], length[ok]
                same = hashes.spans(starts[at], length) == rows.full[row]
                best[at[same]], texts[at[same]] = length[same], rows.text[row[same]]
        found = best > 0
        return starts[found], best[found], texts[found]


def _leftmost(prompt: str, starts: np.ndarray, lengths: np.ndarray, texts: np.ndarray,
              limit: int) -> list[tuple[int, int, str]]:
    """The leftmost matches, each checked character for character, at most `limit`; the scan gives up
    once it has compared twice the prompt's characters (a failed check needs a crafted hash collision)."""
    out: list[tuple[int, int, str]] = []
    resume, compared = 0, 0
    while len(out) < limit:
        i = int(np.searchsorted(starts, resume))
        if i == len(starts):
            break
        start, text = int(starts[i]), texts[i]
        compared += int(lengths[i])
        if compared > 2 * len(prompt):
            break
        if prompt.startswith(text, start):
            out.append((start, start + len(text), text))
            resume = start + len(text)
        else:
            resume = start + 1
    return out
