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
from typing import Hashable

from sglang_mepic import env
from sglang_mepic.frontend.known_index import MAX_SAME_START, _Index, _leftmost
from sglang_mepic.frontend.text_hashes import ANCHOR, _digest, _Hashes, anchor_of, window_hashes
from sglang_mepic.wire.layout import Kind
from sglang_mepic.wire.namespace import tenant_key

# Names others read here, those of text_hashes.py and known_index.py among them.
__all__ = ["ANCHOR", "ENTRY_BYTES", "MAX_SAME_START", "NAMESPACE_BYTES", "IndexFull", "KnownTextError", "KnownTexts",
           "Namespace", "_Hashes", "anchor_of", "known_pieces", "namespace_bytes", "namespace_of", "registry",
           "text_bytes", "window_hashes"]

# What the index holds for a text beside its string, in bytes, with room (tests/frontend/test_known_texts.py
# measures it): its place in its namespace's recency order (about 120), its row (41), its share of the
# bit tables (at most 4 * known_index.FILTER_SLOTS) and, until the next merge, its entry among the recent ones.
ENTRY_BYTES = 512
# A namespace's record, recency order and place in the table of namespaces (its name's strings on top).
NAMESPACE_BYTES = 1024


class KnownTextError(ValueError):
    """A registration the server refuses (a 400)."""


def text_bytes(text: str) -> int:
    """What the index charges for holding a text."""
    return sys.getsizeof(text) + ENTRY_BYTES


def namespace_bytes(namespace: object) -> int:
    """What the index charges for a namespace, its name included (a client chooses its length)."""
    parts = namespace if isinstance(namespace, tuple) else (namespace,)
    return NAMESPACE_BYTES + sum(sys.getsizeof(part) for part in parts if isinstance(part, str))


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
