"""What each reuse mode recomputes and keeps: the one home of the mode rules.

The planner (cache/planner.py), admission (cache/admission.py), the figures
(cache/report.py) and the attention backend (attention/backend.py) ask these
functions instead of testing the mode themselves, so that a mode's rule is
written once and the parts that apply it agree:
- full: no chunk reuse (SGLang's prefix cache only);
- naive, mepic: requests read the store's canonical pages in place (shared);
- EPIC: each chunk's first `tokens` (whole pages) recomputed; the rest copied into
  pages of the request's own at admission (a private copy no one else matches);
- CacheBlend: every token computed up to the check layer; there the `ratio`
  share of each request's stored tokens whose fresh KV deviates most is selected
  for recompute, and the others keep the stored KV (copied into the request's
  own slots at admission) in the layers after it.
The mode itself (`Mode`, `--mepic-mode`'s value) is defined here too. Imports nothing of the package, and
torch only where a rule computes on tensors: config reads the mode through this module in every process,
the launcher's too.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class Kind(enum.Enum):
    FULL = "full"              # no chunk reuse; SGLang's prefix cache only
    NAIVE = "naive"            # shared chunk KV, nothing recomputed
    EPIC = "epic"              # first k tokens (whole pages) recomputed, private copy per request
    CACHEBLEND = "cacheblend"  # fraction r with the largest KV deviation recomputed, private copy
    MEPIC = "mepic"            # first block(s) recomputed, canonical pages shared


@dataclass(frozen=True)
class Mode:
    kind: Kind
    tokens: int = 0            # epic-k: leading tokens of each chunk recomputed
    ratio: float = 0.0         # cacheblend-r: fraction of chunk tokens recomputed
    # cacheblend: the layer whose KV deviation selects tokens. Layer 1, as LMCache's CacheBlend
    # (LMCACHE_BLEND_CHECK_LAYERS=1): layer 0's NoPE KV depends on the token alone, so its deviation is 0.
    check_layer: int = 1

    @property
    def name(self) -> str:
        if self.kind is Kind.EPIC:
            return f"epic-{self.tokens}"
        if self.kind is Kind.CACHEBLEND:
            return f"cacheblend-{self.ratio:g}"
        return self.kind.value

    @property
    def shares(self) -> bool:
        """Requests read the chunk store's pages in place (no private copy)."""
        return self.kind in (Kind.NAIVE, Kind.MEPIC)

    @property
    def reuses(self) -> bool:
        return self.kind is not Kind.FULL


MODE_HELP = "full | naive | mepic | epic-K (K tokens, e.g. epic-16) | cacheblend-R (fraction, e.g. cacheblend-0.15)"


def parse_mode(text: str) -> Mode:
    text = text.strip().lower()
    for kind in (Kind.FULL, Kind.NAIVE, Kind.MEPIC):
        if text == kind.value:
            return Mode(kind)
    m = re.fullmatch(r"epic-(\d+)", text)
    if m and int(m.group(1)) >= 1:
        return Mode(Kind.EPIC, tokens=int(m.group(1)))
    m = re.fullmatch(r"cacheblend-(0?\.\d+|1(\.0*)?|0)", text)
    if m and 0 < float(m.group(1)) <= 1:
        return Mode(Kind.CACHEBLEND, ratio=float(m.group(1)))
    raise ValueError(f"--mepic-mode {text!r}: choose one of {MODE_HELP}")



class Planning(enum.Enum):
    """How a request's chunks are planned against the store."""
    NONE = "none"                      # full: nothing reused
    SHARED = "shared"                  # naive, mepic: canonical pages read in place
    PRIVATE_PREFIX = "private-prefix"  # EPIC: planned from each chunk's first K tokens on, then copied
    BLEND = "blend"                    # CacheBlend: natural order, stored KV substituted slot by slot


def planning(mode: Mode) -> Planning:
    if mode.shares:
        return Planning.SHARED
    return {Kind.EPIC: Planning.PRIVATE_PREFIX, Kind.CACHEBLEND: Planning.BLEND}.get(mode.kind, Planning.NONE)


def canonical_from(mode: Mode, recompute_blocks: int | None) -> int | None:
    """Index of a chunk's first page that the chunk store keeps (None: the store keeps nothing).

    Shared modes keep the pages they do not recompute (mepic: its `--mepic-recompute-blocks`, None for
    all); private-copy modes keep the whole chunk, since which tokens they patch is decided per request.
    """
    if mode.kind is Kind.FULL:
        return None
    if mode.kind is Kind.MEPIC:
        return recompute_blocks
    return 0


# EPIC

def epic_lead_pages(mode: Mode, page_size: int) -> int:
    """Pages at the head of each chunk that EPIC recomputes: its `tokens`, rounded up to whole pages."""
    return -(-mode.tokens // page_size)


def copies_private_prefix(mode: Mode) -> bool:
    """Whether an admitted request copies the stored pages it reads into pages of its own (EPIC)."""
    return mode.kind is Kind.EPIC


# CacheBlend

def holds_chunks_beside_prompt(mode: Mode) -> bool:
    """Whether a planned request holds its chunks' stored pages until pages of its own for its whole
    prompt are allocated: CacheBlend copies the stored KV into its prompt's slots, EPIC into pages for
    its prefix (its private copy) beside the ones SGLang allocates for the rest. The pool must hold both."""
    return planning(mode) in (Planning.BLEND, Planning.PRIVATE_PREFIX)


def blend_check_layer(mode: Mode, layers: int) -> int:
    """The layer whose KV deviation selects the recomputed tokens; a model with fewer layers checks its last."""
    return min(mode.check_layer, layers - 1)


def blend_recomputed(mode: Mode, stored: int) -> int:
    """Of `stored` tokens that found stored KV, how many one request recomputes after all."""
    return math.ceil(mode.ratio * stored)


def blend_keep_stored(mode: Mode, deviation: torch.Tensor, request: torch.Tensor) -> torch.Tensor:
    """Which of the tokens that found stored KV keep it (True) after the check layer.

    deviation: each such token's squared distance between its fresh KV and the stored KV at the
    check layer; request: the batch row each belongs to. Per request, the `blend_recomputed` tokens
    that deviate most are recomputed; the selection never crosses requests.
    """
    import torch  # the attention backend's call: torch is loaded there

    keep = torch.ones_like(request, dtype=torch.bool)
    for b in torch.unique(request).tolist():
        mine = torch.nonzero(request == b).flatten()
        keep[mine[deviation[mine].topk(blend_recomputed(mode, mine.numel())).indices]] = False
    return keep
