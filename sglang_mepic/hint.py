"""The `mepic.chunks` kv_hints action: what the tokenizer side tells the scheduler about a
request's chunks. Every producer encodes a `Hint` here and every consumer decodes it here.

Shapes of one versioned message:

- **Not laid out** (`pads` None): the chunk spans are token spans of the plain ids
  (a server without the mepic attention backend and cache, or `full` mode); the
  scheduler plans nothing for it.
- **Laid out in slots** (`pads` given, perhaps empty): chunks start on page
  boundaries and pad slots fill their last (or first) pages; `compiles` names
  the compile request sent for each chunk segment (compiles.py).
- **A compile** (`compile`): the standalone computation of one chunk, laid out,
  whose pages the scheduler stores for every request to reuse.

Only the server makes one: the tokenizer side seals each action with its mark
(`MARK_KEY`, an HMAC of the payload and the request's ids, intake.py), and a
request whose action does not carry the seal of its own payload and ids is
refused before it reaches the scheduler. This module owns the wire format, not
the trust check.
"""

from dataclasses import dataclass

HINT_TYPE = "mepic.chunks"
VERSION = "1"
MARK_KEY = "by"  # the server's seal (intake.stamp); decoding ignores it

_ACTION_ID = {False: "mepic-chunks", True: "mepic-compile"}
_KEYS = {"chunks", "pads", "compile", "compiles", MARK_KEY}

Span = tuple[int, int]


class HintError(ValueError):
    """A `mepic.chunks` action this server cannot read."""


@dataclass(frozen=True)
class Hint:
    chunks: tuple[Span, ...]              # [start, end) of each chunk segment, in order
    pads: tuple[Span, ...] | None = None  # (first slot, count) of each pad run; None: not laid out in slots
    compile: bool = False                 # the standalone compile of its one chunk
    compiles: tuple[str | None, ...] = ()  # rid of the compile sent for each chunk segment (None: none sent)
    version: str = VERSION

    def __post_init__(self):
        _check(self)

    @property
    def laid_out(self) -> bool:
        return self.pads is not None


def encode(hint: Hint) -> dict:
    """The kv_hints action (as the dict `KvHintAction(**action)` takes), not yet stamped."""
    payload: dict = {"chunks": [list(s) for s in hint.chunks]}
    if hint.pads is not None:
        payload["pads"] = [list(r) for r in hint.pads]
    if hint.compile:
        payload["compile"] = True
    if hint.compiles:
        payload["compiles"] = list(hint.compiles)
    return {"action_id": _ACTION_ID[hint.compile], "action_type": HINT_TYPE, "action_version": hint.version,
            "payload": payload}


def decode(kv_hints, num_slots: int | None = None) -> Hint | None:
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
    compile_ = payload.get("compile", False)
    if not isinstance(compile_, bool):
        raise HintError(f"{HINT_TYPE}: compile is {compile_!r}, not true or false")
    compiles = payload.get("compiles", [])
    if not isinstance(compiles, list):
        raise HintError(f"{HINT_TYPE}: compiles is {compiles!r}, not a list")
    hint = Hint(chunks=_spans(payload.get("chunks", []), "chunks"),
                pads=None if payload.get("pads") is None else _spans(payload["pads"], "pads"),
                compile=compile_, compiles=tuple(compiles))
    if num_slots is not None:
        for name, spans in (("chunk span", hint.chunks), ("pad run", _ends(hint.pads or ()))):
            for start, end in spans:
                if end > num_slots:
                    raise HintError(f"{HINT_TYPE}: {name} [{start}, {end}) is out of range "
                                    f"for {num_slots} slots")
    return hint


def decode_laid_out(kv_hints) -> Hint | None:
    """The hint of a request laid out in slots (None: no hint, or one not laid out)."""
    hint = decode(kv_hints)
    return hint if hint is not None and hint.laid_out else None


def _spans(value, name: str) -> tuple[Span, ...]:
    if not isinstance(value, list):
        raise HintError(f"{HINT_TYPE}: {name} is {value!r}, not a list")
    spans = []
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(_is_int(v) for v in item)):
            raise HintError(f"{HINT_TYPE}: {name} entry {item!r} is not a pair of whole numbers")
        spans.append((int(item[0]), int(item[1])))
    return tuple(spans)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ends(runs) -> list[Span]:
    return [(start, start + count) for start, count in runs]


def _check(hint: Hint) -> None:
    """Spans in order, not overlapping, in range; compiles one per chunk segment."""
    if hint.version != VERSION:
        raise HintError(f"{HINT_TYPE} version {hint.version!r} is not supported (this server reads "
                        f"version {VERSION!r})")
    _ordered(hint.chunks, "chunk span")
    if hint.pads is not None:
        if any(count < 1 for _, count in hint.pads):
            raise HintError(f"{HINT_TYPE}: a pad run is empty: {[list(r) for r in hint.pads]}")
        _ordered(_ends(hint.pads), "pad run")
    if not isinstance(hint.compile, bool):
        raise HintError(f"{HINT_TYPE}: compile is {hint.compile!r}, not true or false")
    if hint.compile and (hint.pads is None or len(hint.chunks) != 1):
        raise HintError(f"{HINT_TYPE}: a compile is one chunk laid out in slots")
    if hint.compiles and (hint.pads is None or len(hint.compiles) != len(hint.chunks)):
        raise HintError(f"{HINT_TYPE}: {len(hint.compiles)} compiles named for {len(hint.chunks)} chunk segments "
                        "(a laid-out request names one per segment)")
    if not all(rid is None or (isinstance(rid, str) and rid) for rid in hint.compiles):
        raise HintError(f"{HINT_TYPE}: a compile is named by a request id or null, not {list(hint.compiles)!r}")


def _ordered(spans, name: str) -> None:
    end = 0
    for s in spans:
        if not end <= s[0] < s[1]:
            raise HintError(f"{HINT_TYPE}: {name} [{s[0]}, {s[1]}) is out of order or out of range")
        end = s[1]
