"""Tokenizer side: documents registered for reuse, found in prompts nobody marked.

A RAG service that pastes its retrieved documents into one plain prompt marks
nothing. Under `--mepic-auto-chunk known` it registers its documents once, per
cache namespace (`POST /mepic/chunks`), and every later plain prompt that holds
one is split into pieces exactly as if the client had marked it: the same
pieces, tokenized alone, so the same chunk keys, and a document stored from a
marked request is reused from an unmarked one and the other way round.

**Registered, not "whatever the cache holds".** How a prompt is laid out decides
what is computed, so a layout that followed residency would make a request's
output depend on what the cache happened to hold (and let one tenant's traffic
change another's answers). A namespace's texts stay known until its own
registrations push them out (least recently registered or found first); nothing
another namespace does, and no eviction, changes them.

**Bounded, all of it.** The index charges every byte it holds to `budget`
(`--mepic-known-texts-mb`): each text's string and its share of the index
(`ENTRY_BYTES`), and each namespace's own record and name (`NAMESPACE_BYTES`).
A registration that would not fit, once the namespace's own older texts are
dropped, is refused (`IndexFull`) instead of pushing out another's.

**Finding them.** Each text is indexed by the hash of its first `ANCHOR`
characters, mixed with a salt of its namespace (the key), in one index for all
namespaces: rows sorted by key, the texts added since the last sort beside them
(sorted in once they outnumber the square root of the rows, so a change costs
that root, never the whole index), and two bit tables of two bit fields of the
keys. A prompt's windows of `ANCHOR` characters are hashed at once with numpy (a
polynomial hash mod 2^64: prefix sums of c_j*B^j, each window scaled by B^-i);
the bit tables pass about 1 window in 250 by chance, the passing windows are
looked up in the rows, and each of the at most `MAX_SAME_START` texts of the
namespace under a window's key is compared by the hash of its whole span, all
windows at once. Cost: a few array passes over the prompt, whatever was
registered; only the texts taken are compared character for character. Texts
shorter than `ANCHOR` characters cannot be registered.

**Overlaps.** The leftmost match is taken first; of matches starting at one
character, the longest (by hash: should its characters differ, that start is
skipped); the scan resumes at its end. Matches never overlap or nest: a
registered text inside another is found only where the outer is not. The scan
stops after `limit` matches, and once the characters it compared exceed twice
the prompt's (only crafted hash collisions can fail a comparison).
"""

import secrets
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import count
from math import isqrt
from typing import Hashable, Sequence

import numpy as np

from sglang_mepic import env
from sglang_mepic.wire.layout import Kind
from sglang_mepic.wire.namespace import tenant_key

ANCHOR = 64
_B = 0x100000001B3  # odd: invertible mod 2^64
_B_INV = pow(_B, -1, 1 << 64)
_MASK = (1 << 64) - 1
# Texts of a namespace that may share one start: each is compared wherever the start occurs in a prompt.
MAX_SAME_START = 8
# Bit-table slots a key, in each of the two tables (sized at each merge, for the rows and the texts
# that may be added before the next): about 1 window in 16 passes each by chance.
FILTER_SLOTS = 16
# Texts added since the last sort are sorted in once there are more than this, or than the root of the rows.
MERGE_AT = 64
# What the index holds for a text beside its string, in bytes, with room (tests/frontend/test_known_texts.py
# measures it): its place in its namespace's recency order (about 120), its row (41), its share of the
# bit tables (at most 4 * FILTER_SLOTS) and, until the next merge, its entry among the recent ones.
ENTRY_BYTES = 512
# A namespace's record, recency order and place in the table of namespaces (its name's strings on top).
NAMESPACE_BYTES = 1024


class KnownTextError(ValueError):
    """A registration the server refuses (a 400)."""


class _Powers:
    """B^i and B^-i mod 2^64 for i < n, grown as longer prompts come."""

    def __init__(self) -> None:
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    KEPT = 1 << 20  # powers kept for prompts up to this many characters; a longer one computes its own

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n:
            size = max(n, 2 * len(self.up))
            with np.errstate(over="ignore"):
                up = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _B, dtype=np.uint64))])
                down = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _B_INV, dtype=np.uint64))])
            if size > self.KEPT:
                return up[:n], down[:n]
            self.up, self.down = up, down
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def _codes(text: str) -> np.ndarray:
    # One code unit a Python character, lone surrogates (valid JSON escapes) included.
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)


class _Hashes:
    """Prefix sums of a text's c_j*B^j: the hash of any span in O(1), as `anchor_of` hashes a start."""

    def __init__(self, text: str) -> None:
        n = len(text)
        up, self.down = _POWERS.get(max(n, 1))
        with np.errstate(over="ignore"):
            self.prefix = np.concatenate([[np.uint64(0)], np.cumsum(_codes(text) * up[:n], dtype=np.uint64)])

    def windows(self) -> np.ndarray:
        """The hash of every window of ANCHOR characters, by its first character."""
        n = len(self.prefix) - 1
        if n < ANCHOR:
            return np.zeros(0, dtype=np.uint64)
        with np.errstate(over="ignore"):
            return (self.prefix[ANCHOR:] - self.prefix[:-ANCHOR]) * self.down[:n - ANCHOR + 1]

    def spans(self, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """The hash of each span [start, start + length), all at once."""
        with np.errstate(over="ignore"):
            return (self.prefix[starts + lengths] - self.prefix[starts]) * self.down[starts]

    def span(self, start: int, length: int) -> int:
        return ((int(self.prefix[start + length]) - int(self.prefix[start])) * int(self.down[start])) & _MASK


def anchor_of(text: str) -> int:
    """The hash of a text's first ANCHOR characters (as `_Hashes.windows` hashes a window)."""
    head = text[:ANCHOR]
    return _Hashes(head).span(0, len(head))


def window_hashes(text: str) -> np.ndarray:
    """The hash of every window of ANCHOR characters of `text`, by its first character."""
    return _Hashes(text).windows()


def _digest(text: str) -> tuple[int, int]:
    """A text's anchor and the hash of its whole span, from one pass."""
    hashes = _Hashes(text)
    return hashes.span(0, min(ANCHOR, len(text))), hashes.span(0, len(text))


def text_bytes(text: str) -> int:
    """What the index charges for holding a text."""
    return sys.getsizeof(text) + ENTRY_BYTES


def namespace_bytes(namespace: object) -> int:
    """What the index charges for a namespace, its name included (a client chooses its length)."""
    parts = namespace if isinstance(namespace, tuple) else (namespace,)
    return NAMESPACE_BYTES + sum(sys.getsizeof(part) for part in parts if isinstance(part, str))


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


class IndexFull(KnownTextError):
    """The texts do not fit beside what other namespaces hold (a 507)."""


@dataclass
class Namespace:
    """One namespace's registered texts, least recently registered or found first."""

    owner: int      # its rows' owner in the index
    salt: int       # mixed into its keys: its rows lie apart from every other namespace's
    charged: int    # bytes charged for it, its texts included
    texts: OrderedDict[str, None] = field(default_factory=OrderedDict)  # text -> None, least recent first

    def key(self, text: str) -> int:
        return anchor_of(text) ^ self.salt


class KnownTexts:
    """The registered texts of every namespace, within `budget` bytes in all (what the index holds)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.used = 0
        self.spaces: dict[Hashable, Namespace] = {}
        self.index = _Index()
        self._owners = count(1)

    @staticmethod
    def check(text: object) -> None:
        if not isinstance(text, str) or len(text) < ANCHOR:
            raise KnownTextError(f"a registered text needs at least {ANCHOR} characters; mark shorter ones with "
                                 "<|chunk|>...<|/chunk|>")

    def add_all(self, namespace: Hashable, texts: list[str]) -> list[bool]:
        """Register `texts` in `namespace` (a known one is refreshed), all or none; whether each was new.

        Room is made by forgetting the namespace's own least recent texts, never another's: texts that
        do not fit beside what other namespaces hold raise IndexFull and register nothing."""
        for text in texts:
            self.check(text)
        space = self.spaces.get(namespace)
        held = space.texts if space is not None else {}
        fresh = {t: _digest(t) for t in texts if t not in held}  # -> (anchor, full hash)
        self._check_starts(space, fresh)
        need = namespace_bytes(namespace) + sum(map(text_bytes, dict.fromkeys(texts)))  # the known ones stay too
        if need + self.used - (space.charged if space is not None else 0) > self.budget:
            raise IndexFull(f"the texts need {need} bytes, more than this server's registered-text index "
                            "(--mepic-known-texts-mb) has room for; register fewer, or ask the operator for a "
                            "larger index")
        if space is None:
            space = self.spaces[namespace] = Namespace(next(self._owners), secrets.randbits(64),
                                                       namespace_bytes(namespace))
            self.used += space.charged
        new = [t not in space.texts for t in texts]
        for text in texts:
            if text in space.texts:
                space.texts.move_to_end(text)
        kept = set(texts)
        for text in fresh:
            while self.used + text_bytes(text) > self.budget:
                oldest = next(iter(space.texts))
                if oldest in kept:  # this request's texts stay; all of them fit, by the check above
                    space.texts.move_to_end(oldest)
                    continue
                self._drop(space, oldest)
            anchor, full = fresh[text]
            self.index.add(space.owner, anchor ^ space.salt, full, text)
            space.texts[text] = None
            space.charged += text_bytes(text)
            self.used += text_bytes(text)
        return new

    def _check_starts(self, space: Namespace | None, fresh: dict[str, tuple[int, int]]) -> None:
        starts: dict[int, int] = {}
        for text, (anchor, _) in fresh.items():
            if anchor not in starts:
                starts[anchor] = self.index.count(anchor ^ space.salt, space.owner) if space is not None else 0
            starts[anchor] += 1
            if starts[anchor] > MAX_SAME_START:
                raise KnownTextError(f"more than {MAX_SAME_START} registered texts would start with the same "
                                     f"{ANCHOR} characters ({text[:ANCHOR]!r}); register them with distinct starts")

    def _drop(self, space: Namespace, text: str) -> None:
        del space.texts[text]
        self.index.remove(space.owner, space.key(text), text)
        space.charged -= text_bytes(text)
        self.used -= text_bytes(text)

    def add(self, namespace: Hashable, text: str) -> bool:
        return self.add_all(namespace, [text])[0]

    def remove_all(self, namespace: Hashable, texts: list[str]) -> None:
        """Forget these texts of the namespace (a registration undone); a namespace left empty goes."""
        space = self.spaces.get(namespace)
        if space is None:
            return
        for text in dict.fromkeys(texts):
            if text in space.texts:
                self._drop(space, text)
        if not space.texts:
            del self.spaces[namespace]
            self.used -= space.charged

    def find(self, namespace: Hashable, prompt: str, limit: int | None = None) -> list[tuple[int, int]]:
        """[start, end) character spans of the namespace's texts in `prompt`, by the rule above, at most
        `limit` (the first ones)."""
        space = self.spaces.get(namespace)
        if space is None or len(prompt) < ANCHOR:
            return []
        found = _leftmost(prompt, *self.index.matches(space.owner, space.salt, _Hashes(prompt)),
                          len(prompt) if limit is None else limit)
        for _, _, text in found:
            space.texts.move_to_end(text)
        return [(start, end) for start, end, _ in found]

    def size(self, namespace: Hashable) -> int:
        space = self.spaces.get(namespace)
        return len(space.texts) if space is not None else 0


_REGISTRY: KnownTexts | None = None


def registry() -> KnownTexts:
    """This tokenizer process's registered texts (--mepic-known-texts-mb in all)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = KnownTexts(env.settings().known_texts_bytes)
    return _REGISTRY


def namespace_of(extra_key: str | None, cache_salt: str | None) -> tuple[str | None, str | None]:
    """A request's namespace for registered texts: the one its chunks' KV is keyed in (wire/namespace.py). The
    LoRA adapter is left out: it keeps the chunks' KV apart in the cache already, and a text registered once
    serves every adapter."""
    return tenant_key(extra_key, cache_salt)


def known_pieces(text: str, namespace: Hashable, max_chars: int | None = None) -> list[tuple[Kind, str]] | None:
    """The text's pieces with each registered text found in it a chunk (at most --mepic-max-chunks,
    the first ones); None where none is found, known texts are off, or the text has more than
    `max_chars` characters (more than fit the context: not searched)."""
    if not env.settings().known_texts or (max_chars is not None and len(text) > max_chars):
        return None
    spans = registry().find(namespace, text, env.settings().max_chunks)
    if not spans:
        return None
    parts: list[tuple[Kind, str]] = []
    at = 0
    for start, end in spans:
        if start > at:
            parts.append((Kind.PROMPT, text[at:start]))
        parts.append((Kind.CHUNK, text[start:end]))
        at = end
    if at < len(text):
        parts.append((Kind.PROMPT, text[at:]))
    return parts
