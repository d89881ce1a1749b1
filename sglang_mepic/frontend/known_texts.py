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
another namespace does, and no eviction, changes them. The index as a whole is
bounded: a registration that would not fit, once the namespace's own older texts
are dropped, is refused (`IndexFull`) instead of pushing out another's.

**Finding them.** Each text is indexed by the hash of its first `ANCHOR`
characters. A prompt's windows of `ANCHOR` characters are hashed at once with
numpy (a polynomial hash mod 2^64: prefix sums of c_j*B^j, each window scaled by
B^-i); two bit tables of two bit fields of the anchors (64 bits a text each, so
about 1 window in 4,000 passes both by chance) pick the windows to look up,
and each hit is verified character for character. Cost: linear in the prompt,
independent of the number of texts. Texts shorter than `ANCHOR`
characters cannot be registered.

**Overlaps.** The leftmost match is taken first; of matches starting at one
character, the longest; the scan resumes at its end. Matches never overlap or
nest: a registered text inside another is found only where the outer is not.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from sglang_mepic import config
from sglang_mepic.wire.segments import Kind

ANCHOR = 64
_B = 0x100000001B3  # odd: invertible mod 2^64
_B_INV = pow(_B, -1, 1 << 64)
_MASK = (1 << 64) - 1
# Texts that may share one start: each is a candidate wherever the start occurs in a prompt.
MAX_SAME_START = 8


class KnownTextError(ValueError):
    """A registration the server refuses (a 400)."""


class _Powers:
    """B^i and B^-i mod 2^64 for i < n, grown as longer prompts come."""

    def __init__(self):
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

    def __init__(self, text: str):
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

    def span(self, start: int, length: int) -> int:
        return ((int(self.prefix[start + length]) - int(self.prefix[start])) * int(self.down[start])) & _MASK


def anchor_of(text: str) -> int:
    """The hash of a text's first ANCHOR characters (as `_Hashes.windows` hashes a window)."""
    head = text[:ANCHOR]
    return _Hashes(head).span(0, len(head))


def window_hashes(text: str) -> np.ndarray:
    """The hash of every window of ANCHOR characters of `text`, by its first character."""
    return _Hashes(text).windows()


def text_hash(text: str) -> int:
    return _Hashes(text).span(0, len(text))


@dataclass
class Namespace:
    """One namespace's registered texts: least recently registered or found first, and their anchors."""

    texts: OrderedDict = field(default_factory=OrderedDict)   # text -> None, least recent first
    anchors: dict = field(default_factory=dict)               # anchor -> [(text, its hash)] starting with it
    chars: int = 0
    _filter: tuple | None = None   # bit tables of two bit fields of the anchors, rebuilt after a change

    def add(self, text: str) -> None:
        entry = (text, text_hash(text))
        self.anchors.setdefault(anchor_of(text), []).append(entry)
        self.texts[text] = None
        self.chars += len(text)
        self._filter = None

    def drop_oldest(self) -> int:
        """Forget the least recent text; returns its length."""
        text = next(iter(self.texts))
        del self.texts[text]
        key = anchor_of(text)
        same = self.anchors[key]
        same[:] = [e for e in same if e[0] != text]
        if not same:
            del self.anchors[key]
        self.chars -= len(text)
        self._filter = None
        return len(text)

    def find(self, prompt: str) -> list[tuple[int, int]]:
        """[start, end) character spans of the known texts in `prompt`, by the rule above."""
        if not self.anchors or len(prompt) < ANCHOR:
            return []
        if self._filter is None:
            size = 1 << max(12, min(24, (64 * len(self.anchors)).bit_length()))
            anchors = np.array(list(self.anchors), dtype=np.uint64)
            low, high = np.zeros(size, dtype=bool), np.zeros(size, dtype=bool)
            low[anchors & np.uint64(size - 1)] = True
            high[(anchors >> np.uint64(40)) & np.uint64(size - 1)] = True
            self._filter = (low, high)
        low, high = self._filter
        mask = np.uint64(len(low) - 1)
        spans_of = _Hashes(prompt)
        hashes = spans_of.windows()
        starts = np.flatnonzero(low[hashes & mask])
        keys = hashes[starts]
        starts, keys = starts[high[(keys >> np.uint64(40)) & mask]], keys[high[(keys >> np.uint64(40)) & mask]]
        # Every (start, text) whose whole span hashes as the text does, vectorised a start and length at
        # a time: a prompt that repeats a registered start costs array work, not a Python loop a window.
        candidates = []
        for key in np.unique(keys).tolist():
            entries = self.anchors.get(key)
            if not entries:
                continue  # the bit table let it through by chance
            at = starts[keys == key]
            for text, full in entries:
                fits = at[at + len(text) <= len(prompt)]
                with np.errstate(over="ignore"):
                    same = (spans_of.prefix[fits + len(text)] - spans_of.prefix[fits]) * spans_of.down[fits]
                candidates += [(int(i), -len(text), text) for i in fits[same == np.uint64(full)]]
        spans, resume = [], 0
        for start, _, text in sorted(candidates):
            if start < resume or not prompt.startswith(text, start):  # the longest first at one start
                continue
            self.texts.move_to_end(text)
            spans.append((start, start + len(text)))
            resume = start + len(text)
        return spans


class IndexFull(KnownTextError):
    """The texts do not fit beside what other namespaces hold (a 507)."""


class KnownTexts:
    """The registered texts of every namespace, within `budget_chars` characters in all."""

    def __init__(self, budget_chars: int):
        self.budget = budget_chars
        self.chars = 0
        self.spaces: dict = {}

    @staticmethod
    def check(text) -> None:
        if not isinstance(text, str) or len(text) < ANCHOR:
            raise KnownTextError(f"a registered text needs at least {ANCHOR} characters; mark shorter ones with "
                                 "<|chunk|>...<|/chunk|>")

    def add_all(self, namespace, texts: list[str]) -> list[bool]:
        """Register `texts` in `namespace` (a known one is refreshed), all or none; whether each was new.

        Room is made by forgetting the namespace's own least recent texts, never another's: texts that
        do not fit beside what other namespaces hold raise IndexFull and register nothing."""
        for text in texts:
            self.check(text)
        space = self.spaces.get(namespace) or Namespace()
        fresh = list(dict.fromkeys(t for t in texts if t not in space.texts))
        starts: dict = {}
        for text in fresh:
            key = anchor_of(text)
            starts[key] = starts.get(key, len(space.anchors.get(key, ()))) + 1
            if starts[key] > MAX_SAME_START:
                raise KnownTextError(f"more than {MAX_SAME_START} registered texts would start with the same "
                                     f"{ANCHOR} characters ({text[:ANCHOR]!r}); register them with distinct starts")
        need = sum(map(len, dict.fromkeys(texts)))  # the known ones stay too
        others = self.chars - space.chars
        if need + others > self.budget:
            raise IndexFull(f"the texts need {need} characters, more than this server's registered-text index "
                            "(--mepic-known-texts-mb) has room for; register fewer, or ask the operator for a "
                            "larger index")
        self.spaces[namespace] = space
        new = [t not in space.texts for t in texts]
        for text in texts:
            if text in space.texts:
                space.texts.move_to_end(text)
        kept = set(texts)
        for text in fresh:
            while self.chars + len(text) > self.budget:
                oldest = next(iter(space.texts))
                if oldest in kept:  # this request's texts stay; all of them fit, by the check above
                    space.texts.move_to_end(oldest)
                    continue
                self.chars -= space.drop_oldest()
            space.add(text)
            self.chars += len(text)
        return new

    def add(self, namespace, text: str) -> bool:
        return self.add_all(namespace, [text])[0]

    def find(self, namespace, prompt: str) -> list[tuple[int, int]]:
        space = self.spaces.get(namespace)
        return space.find(prompt) if space is not None else []

    def size(self, namespace) -> int:
        space = self.spaces.get(namespace)
        return len(space.texts) if space is not None else 0


_REGISTRY: KnownTexts | None = None


def registry() -> KnownTexts:
    """This tokenizer process's registered texts (--mepic-known-texts-mb in all)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = KnownTexts(config.known_texts_chars())
    return _REGISTRY


def namespace_of(extra_key, cache_salt) -> tuple:
    """A request's namespace for registered texts: what keeps its cache entries apart from another
    tenant's (SGLang treats an empty cache_salt as none). The LoRA adapter is left out: it keeps the
    chunks' KV apart in the cache already, and a text registered once serves every adapter."""
    return (extra_key if isinstance(extra_key, str) and extra_key else None,
            cache_salt if isinstance(cache_salt, str) and cache_salt else None)


def known_pieces(text: str, namespace) -> list[tuple[Kind, str]] | None:
    """The text's pieces with each registered text found in it a chunk (at most --mepic-max-chunks,
    the first ones); None where none is found, or known texts are off."""
    if not config.known_texts_on():
        return None
    spans = registry().find(namespace, text)[:config.max_chunks()]
    if not spans:
        return None
    parts, at = [], 0
    for start, end in spans:
        if start > at:
            parts.append((Kind.PROMPT, text[at:start]))
        parts.append((Kind.CHUNK, text[start:end]))
        at = end
    if at < len(text):
        parts.append((Kind.PROMPT, text[at:]))
    return parts
