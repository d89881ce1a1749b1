"""The `mepic.chunks` kv_hints action: what the tokenizer side tells the scheduler about a
request's chunks. Every producer encodes a `Hint` here and every consumer decodes it here.

Shapes of one versioned message:

- **Not laid out** (`pads` None): the chunk spans are token spans of the plain ids
  (a server without the mepic attention backend and cache, or `full` mode); the
  scheduler plans nothing for it.
- **Laid out in slots** (`pads` given, perhaps empty): chunks start on page
  boundaries and pad slots fill their last (or first) pages.

No hint makes the scheduler store KV: what it stores it computed itself, in the
compile rows it makes (compile_rows.py). Version 1 also had a `compile` shape,
sent by the tokenizer side as an internal request; version 2 has none.

Only the server makes one: the tokenizer side seals each action with its mark
(`MARK_KEY`, an HMAC of the payload and the request's ids, intake.py), and a
request whose action does not carry the seal of its own payload and ids is
refused before it reaches the scheduler. This module owns the wire format, not
the trust check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Sequence

if TYPE_CHECKING:
    from sglang.srt.managers.kv_hints import KvHintsEnvelope

HINT_TYPE = "mepic.chunks"
VERSION = "2"
MARK_KEY = "by"  # the server's seal (intake.seal, at validation); decoding ignores it

ACTION_ID = "mepic-chunks"
_KEYS = {"chunks", "pads", MARK_KEY}

Span = tuple[int, int]


class HintError(ValueError):
    """A `mepic.chunks` action this server cannot read."""


@dataclass(frozen=True)
class Hint:
    chunks: tuple[Span, ...]              # [start, end) of each chunk segment, in order
    pads: tuple[Span, ...] | None = None  # (first slot, count) of each pad run; None: not laid out in slots
    version: str = VERSION

    def __post_init__(self) -> None:
        _check(self)

    @property
    def laid_out(self) -> bool:
        return self.pads is not None


def encode(hint: Hint) -> dict[str, Any]:
    """The kv_hints action (as the dict `KvHintAction(**action)` takes), not yet stamped."""
    payload: dict[str, Any] = {"chunks": [list(s) for s in hint.chunks]}
    if hint.pads is not None:
        payload["pads"] = [list(r) for r in hint.pads]
    return {"action_id": ACTION_ID, "action_type": HINT_TYPE, "action_version": hint.version,
            "payload": payload}


def decode(kv_hints: KvHintsEnvelope | None, num_slots: int | None = None) -> Hint | None:
    """The hint a request's kv_hints envelope carries (None: none); other action types are not ours.

    `num_slots`, when given, bounds every span. Raises HintError on anything malformed.
    """
    ours = [a for a in (kv_hints.actions if kv_hints is not None else []) if a.action_type == HINT_TYPE]
    if not ours:
        return None
    if len(ours) > 1:
        raise HintError(f"{HINT_TYPE}: {len(ours)} actions in one envelope; a request carries one")
    action = ours[0]
    if action.action_version != VERSION:
        raise HintError(f"{HINT_TYPE} version {action.action_version!r} is not supported (this server reads "
                        f"version {VERSION!r})")
    payload = action.payload
    if not isinstance(payload, dict):
        raise HintError(f"{HINT_TYPE}: the payload is a {type(payload).__name__}, not an object")
    unknown = set(payload) - _KEYS
    if unknown:
        raise HintError(f"{HINT_TYPE}: unknown payload fields {sorted(unknown)}")
    hint = Hint(chunks=_spans(payload.get("chunks", []), "chunks"),
                pads=None if payload.get("pads") is None else _spans(payload["pads"], "pads"))
    if num_slots is not None:
        for name, spans in (("chunk span", hint.chunks), ("pad run", _ends(hint.pads or ()))):
            for start, end in spans:
                if end > num_slots:
                    raise HintError(f"{HINT_TYPE}: {name} [{start}, {end}) is out of range "
                                    f"for {num_slots} slots")
    return hint


def decode_laid_out(kv_hints: KvHintsEnvelope | None) -> Hint | None:
    """The hint of a request laid out in slots (None: no hint, or one not laid out)."""
    hint = decode(kv_hints)
    return hint if hint is not None and hint.laid_out else None


def _spans(value: object, name: str) -> tuple[Span, ...]:
    if not isinstance(value, list):
        raise HintError(f"{HINT_TYPE}: {name} is {value!r}, not a list")
    spans = []
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(_is_int(v) for v in item)):
            raise HintError(f"{HINT_TYPE}: {name} entry {item!r} is not a pair of whole numbers")
        spans.append((int(item[0]), int(item[1])))
    return tuple(spans)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ends(runs: Iterable[Span]) -> list[Span]:
    return [(start, start + count) for start, count in runs]


def _check(hint: Hint) -> None:
    """Spans in order, not overlapping, in range."""
    if hint.version != VERSION:
        raise HintError(f"{HINT_TYPE} version {hint.version!r} is not supported (this server reads "
                        f"version {VERSION!r})")
    _ordered(hint.chunks, "chunk span")
    if hint.pads is not None:
        if any(count < 1 for _, count in hint.pads):
            raise HintError(f"{HINT_TYPE}: a pad run is empty: {[list(r) for r in hint.pads]}")
        _ordered(_ends(hint.pads), "pad run")


def _ordered(spans: Iterable[Sequence[int]], name: str) -> None:
    end = 0
    for s in spans:
        if not end <= s[0] < s[1]:
            raise HintError(f"{HINT_TYPE}: {name} [{s[0]}, {s[1]}) is out of order or out of range")
        end = s[1]
