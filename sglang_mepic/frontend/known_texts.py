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
B^-i); a bit table of the anchors' low bits (64 bits a text, so about 1 window in
64 of a prompt passes by chance) picks the windows to look up in the anchors,
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


class KnownTextError(ValueError):
    """A registration the server refuses (a 400)."""


class _Powers:
    """B^i and B^-i mod 2^64 for i < n, grown as longer prompts come."""

    def __init__(self):
        self.up = np.ones(1, dtype=np.uint64)
        self.down = np.ones(1, dtype=np.uint64)

    def get(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self.up) < n:
            size = max(n, 2 * len(self.up))
            with np.errstate(over="ignore"):
                self.up = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _B, dtype=np.uint64))])
                self.down = np.concatenate([[np.uint64(1)], np.cumprod(np.full(size - 1, _B_INV, dtype=np.uint64))])
        return self.up[:n], self.down[:n]


_POWERS = _Powers()


def _codes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


def anchor_of(text: str) -> int:
    """The hash of a text's first ANCHOR characters (as `window_hashes` hashes a window)."""
    codes = _codes(text[:ANCHOR])
    up, _ = _POWERS.get(len(codes))
    with np.errstate(over="ignore"):
        return int(np.sum(codes * up, dtype=np.uint64))


def window_hashes(text: str) -> np.ndarray:
    """The hash of every window of ANCHOR characters of `text`, by its first character."""
    n = len(text)
    if n < ANCHOR:
        return np.zeros(0, dtype=np.uint64)
    codes = _codes(text)
    up, down = _POWERS.get(n)
    with np.errstate(over="ignore"):
        prefix = np.concatenate([[np.uint64(0)], np.cumsum(codes * up, dtype=np.uint64)])
        return (prefix[ANCHOR:] - prefix[:-ANCHOR]) * down[:n - ANCHOR + 1]


@dataclass
class Namespace:
    """One namespace's registered texts: least recently registered or found first, and their anchors."""

    texts: OrderedDict = field(default_factory=OrderedDict)   # text -> None, least recent first
    anchors: dict = field(default_factory=dict)               # anchor -> texts starting with it
    chars: int = 0
    _filter: np.ndarray | None = None   # bit table of the anchors' low bits, rebuilt after a change

    def add(self, text: str) -> None:
        self.texts[text] = None
        self.anchors.setdefault(anchor_of(text), []).append(text)
        self.chars += len(text)
        self._filter = None

    def drop_oldest(self) -> int:
        """Forget the least recent text; returns its length."""
        text = next(iter(self.texts))
        del self.texts[text]
        key = anchor_of(text)
        same = self.anchors[key]
        same.remove(text)
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
            self._filter = np.zeros(size, dtype=bool)
            self._filter[np.array(list(self.anchors), dtype=np.uint64) & np.uint64(size - 1)] = True
        hashes = window_hashes(prompt)
        hit = self._filter[hashes & np.uint64(len(self._filter) - 1)]
        spans, resume = [], 0
        for start in np.flatnonzero(hit).tolist():
            if start < resume:
                continue
            found = [t for t in self.anchors.get(int(hashes[start]), ()) if prompt.startswith(t, start)]
            if found:
                text = max(found, key=len)
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
        need = sum(map(len, dict.fromkeys(texts)))  # the known ones stay too
        others = self.chars - space.chars
        if need + others > self.budget:
            raise IndexFull(f"the texts need {need} characters, and this server's registered-text index "
                            f"(--mepic-known-texts-mb, {self.budget} characters in all) has "
                            f"{max(0, self.budget - others)} left for this namespace")
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
    return (extra_key if isinstance(extra_key, str) else None,
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
