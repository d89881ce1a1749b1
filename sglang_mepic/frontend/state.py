"""Tokenizer side: what this process keeps beside a client request, reached one way.

- `MarkedRequest`: the server turned the request's markup (or separator, or unmarked
  documents, auto_chunk.py) into its ids and `mepic.chunks` hint (ids_and_hint.py).
  Validation reads it (limits.py: a laid-out request's limits; intake.py: the hint
  is the server's, sealed there once the ids are final), and so do the responses
  (response_report.py: the chunk spans).
- the index of a batch item SGLang split off, so that an error can name the item.
- the server's page size, from its args (`page_size`): the layout pads to it, the limits count in it.

`MarkedRequest` is an attribute, not a side table: with n > 1 SGLang sends and streams
`copy.copy`s of the tokenized request (TokenizerManager's batch path), and each copy's
response reports the chunks. No client can set it (a request body sets declared fields only).
"""

from dataclasses import dataclass
from typing import Iterable, Sequence, cast

from sglang_mepic.side_table import SideTable

ATTR = "_mepic_chunks"


def page_size(manager: object) -> int:
    return int(getattr(getattr(manager, "server_args", None), "page_size", None) or 1)


@dataclass(frozen=True)
class MarkedRequest:
    chunks: tuple[tuple[int, int], ...]  # [start, end) in the real tokens (pads left out)
    real_tokens: int
    slots: int | None  # laid out in slots (chunks on whole pages): how many; else None
    ids_len: int       # the ids the hint was made for: a processor that expands media
    ids_hash: int      # placeholders changes them afterwards, and every span with them

    @classmethod
    def made(cls, chunks: Iterable[Sequence[int]], real_tokens: int, slots: int | None,
             input_ids: Iterable[int]) -> "MarkedRequest":
        ids = tuple(input_ids)
        spans = cast(tuple[tuple[int, int], ...], tuple(tuple(c) for c in chunks))  # [start, end) pairs
        return cls(spans, real_tokens, slots, len(ids), hash(ids))

    def same_ids(self, input_ids: Sequence[object] | None) -> bool:
        if input_ids is None or len(input_ids) != self.ids_len:
            return False
        try:
            return hash(tuple(input_ids)) == self.ids_hash
        except TypeError:  # unhashable items: not the plain ids this server made
            return False


def marked(obj: object) -> MarkedRequest | None:
    state = getattr(obj, ATTR, None)
    return state if isinstance(state, MarkedRequest) else None


def mark(obj: object, state: MarkedRequest) -> None:
    setattr(obj, ATTR, state)


def chunk_spans(obj: object) -> list[list[int]]:
    """The chunks a client request marked (by markup, separator or auto-chunking), as [start, end) pairs."""
    state = marked(obj)
    return [list(span) for span in state.chunks] if state else []


# SGLang splits a batch into per-item objects (`GenerateReqInput.__getitem__`); the item's
# index is kept beside it so that an error can say which item it is about.
ITEMS: SideTable[int] = SideTable("batch item index")


def labelled(obj: object, message: str) -> str:
    item = ITEMS.get(obj)
    return message if item is None or message.startswith("batch item") else f"batch item {item}: {message}"


def relabel(obj: object, error: ValueError) -> ValueError:
    try:
        return type(error)(labelled(obj, str(error)))
    except TypeError:  # an error type that takes other arguments keeps its message
        return error
