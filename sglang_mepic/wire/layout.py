"""Request -> segments -> padded page layout.

A request is a sequence of prompt segments and chunk segments. Padding gives
every chunk one canonical page layout, wherever it sits in a request:

- a chunk starts on a page boundary (everything before it is page-aligned) and
  is padded to whole pages, at the front (`LEADING`, as in the paper: the chunk
  ends on a boundary) or at the back (`TRAILING`: its first page holds a full
  page of real tokens);
- a prompt segment gets trailing pads up to the next boundary, except the last
  segment of the request;
- a chunk that fits in one page is treated as prompt: it has no canonical
  pages to share, since its first page is recomputed anyway;
- a chunk that ends the request is treated as prompt: the last slot must be
  computed in the request (its logits start the answer), and with trailing
  pads it must also hold a real token.

Pad slots hold `PAD_ID`, which is never a real token id. They take no RoPE
position (`NO_POSITION`) and are masked out of attention, so real tokens carry
exactly the positions they would have without padding.
"""

import enum
import hashlib
from array import array
from dataclasses import dataclass
from typing import Sequence

from sglang_mepic.config import Placement  # noqa: F401 (the layout's own name for it)

PAD_ID = -1
NO_POSITION = -1


class Kind(enum.Enum):
    PROMPT = "prompt"
    CHUNK = "chunk"


class SegmentationError(ValueError):
    """The request cannot be laid out; the message is meant for the client."""


@dataclass(frozen=True)
class Piece:
    """A marked-up piece of a request, before padding."""

    kind: Kind
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Segment:
    kind: Kind
    tokens: tuple[int, ...]  # real tokens only
    start: int               # first slot in the request, page-aligned
    lead_pad: int
    tail_pad: int
    first_position: int      # RoPE position of the first real token

    @property
    def size(self) -> int:
        return self.lead_pad + len(self.tokens) + self.tail_pad

    @property
    def end(self) -> int:
        return self.start + self.size

    def padded_tokens(self) -> list[int]:
        return [PAD_ID] * self.lead_pad + list(self.tokens) + [PAD_ID] * self.tail_pad


@dataclass(frozen=True)
class Layout:
    segments: tuple[Segment, ...]
    page_size: int
    placement: Placement
    # [start, end) in the real tokens of every piece marked as a chunk, as marked: a one-page chunk, which
    # the slots carry as prompt, is one too (what a response reports as the request's chunks).
    marked_chunks: tuple[tuple[int, int], ...] = ()

    @property
    def size(self) -> int:
        return self.segments[-1].end if self.segments else 0

    @property
    def chunks(self) -> tuple[Segment, ...]:
        return tuple(s for s in self.segments if s.kind is Kind.CHUNK)

    def slot_tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.padded_tokens()]

    def slot_positions(self) -> list[int]:
        out: list[int] = []
        for s in self.segments:
            out += [NO_POSITION] * s.lead_pad
            out += range(s.first_position, s.first_position + len(s.tokens))
            out += [NO_POSITION] * s.tail_pad
        return out

    def real_tokens(self) -> list[int]:
        return [t for s in self.segments for t in s.tokens]

    def pad_runs(self) -> list[tuple[int, int]]:
        """(first slot, count) of every run of pad slots."""
        runs = []
        for s in self.segments:
            if s.lead_pad:
                runs.append((s.start, s.lead_pad))
            if s.tail_pad:
                runs.append((s.end - s.tail_pad, s.tail_pad))
        return runs


def _merge(pieces: Sequence[Piece], page_size: int) -> list[Piece]:
    """Drop empty prompts, demote one-page chunks to prompt, join adjacent prompts."""
    merged: list[Piece] = []
    for piece in pieces:
        if piece.kind is Kind.CHUNK and not piece.tokens:
            raise SegmentationError("empty chunk: a chunk must contain at least one token")
        kind = piece.kind
        if kind is Kind.CHUNK and len(piece.tokens) <= page_size:
            kind = Kind.PROMPT
        if kind is Kind.PROMPT and not piece.tokens:
            continue
        if kind is Kind.PROMPT and merged and merged[-1].kind is Kind.PROMPT:
            merged[-1] = Piece(Kind.PROMPT, merged[-1].tokens + piece.tokens)
        else:
            merged.append(Piece(kind, piece.tokens))
    return merged


def layout(pieces: Sequence[Piece], page_size: int, placement: Placement = Placement.TRAILING) -> Layout:
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    marked, at = [], 0
    for piece in pieces:
        if piece.kind is Kind.CHUNK:
            marked.append((at, at + len(piece.tokens)))
        at += len(piece.tokens)
    merged = _merge(pieces, page_size)
    if merged and merged[-1].kind is Kind.CHUNK:
        merged = _merge([*merged[:-1], Piece(Kind.PROMPT, merged[-1].tokens)], page_size)
    segments: list[Segment] = []
    slot = position = 0
    for i, piece in enumerate(merged):
        n = len(piece.tokens)
        pad = -n % page_size
        last = i == len(merged) - 1
        if piece.kind is Kind.PROMPT:
            lead, tail = 0, (0 if last else pad)
        elif placement is Placement.LEADING:
            lead, tail = pad, 0
        else:
            lead, tail = 0, pad
        seg = Segment(piece.kind, piece.tokens, slot, lead, tail, position)
        segments.append(seg)
        slot, position = seg.end, position + n
    return Layout(tuple(segments), page_size, placement, tuple(marked))


def span_hash(padded_tokens: Sequence[int], placement: Placement, page_size: int, model_fingerprint: str,
              namespace: str | None) -> str:
    """Identity of a chunk's KV: its padded tokens (pads as PAD_ID), the model, and the cache namespace.

    Tenants with different namespaces (SGLang `extra_key` / cache salt) never share.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{model_fingerprint}\0{namespace or ''}\0{placement.value}\0{page_size}\0".encode())
    h.update(array("q", padded_tokens).tobytes())
    return h.hexdigest()
