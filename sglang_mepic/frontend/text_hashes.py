"""Polynomial hashes of text spans, for finding registered texts in a prompt (known_texts.py).

A text's hash is sum c_j*B^j mod 2^64 over its code units; with the prefix sums of a prompt's c_j*B^j,
every window's hash is one array pass (each window scaled by B^-i), and any span's is O(1). The anchor
of a text is the hash of its first ANCHOR characters, so a window's hash finds the texts that start there.
"""

from __future__ import annotations

import numpy as np

ANCHOR = 64
_B = 0x100000001B3  # odd: invertible mod 2^64
_B_INV = pow(_B, -1, 1 << 64)
_MASK = (1 << 64) - 1


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
