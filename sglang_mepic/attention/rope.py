"""RoPE applied to keys at attention time, from the model's own cos/sin cache.

Keys are stored without rotary embedding (NoPE) and rotated here at the
position each key has in the current request. Every supported variant is a
`RotaryEmbedding` whose scaling (linear, llama3, YaRN with its mscale) is baked
into `cos_sin_cache`, so one rotation covers them all: neox or gptj pairing,
and partial rotary (`rotary_dim < head_size`, the tail passes through).
Anything else is refused when the server starts, never approximated.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

# Rotary classes whose whole effect is `cos_sin_cache` indexed by position.
SUPPORTED = ("RotaryEmbedding", "LinearScalingRotaryEmbedding", "Llama3RotaryEmbedding",
             "YaRNScalingRotaryEmbedding")


class UnsupportedRope(ValueError):
    pass


@dataclass(frozen=True)
class Rope:
    cos_sin_cache: torch.Tensor  # [max_positions, rotary_dim]: cos half, then sin half
    rotary_dim: int
    head_size: int
    is_neox_style: bool

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> "Rope":
        name = type(module).__name__
        if name not in SUPPORTED:
            raise UnsupportedRope(
                f"the mepic attention backend cannot rotate keys for {name}; supported: {', '.join(SUPPORTED)}")
        if getattr(module, "position_start", 0):
            raise UnsupportedRope(f"{name} with position_start={module.position_start} is not supported")
        if module.rotary_dim % 2 or module.rotary_dim > module.head_size:
            raise UnsupportedRope(f"rotary_dim {module.rotary_dim} does not fit head size {module.head_size}")
        return cls(module.cos_sin_cache, module.rotary_dim, module.head_size, module.is_neox_style)

    def table(self, positions: torch.Tensor | None, n: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The cos/sin rows `rotate` applies at positions [n], or at 0..n-1 if positions is None, in `dtype`
        (default: the cache's). A forward whose layers rotate at the same positions looks them up once
        (`reference.PagedContext`)."""
        if positions is None:
            if n > self.cos_sin_cache.shape[0]:
                raise ValueError(f"{n} positions exceed the RoPE cache ({self.cos_sin_cache.shape[0]})")
            rows = self.cos_sin_cache[:n]
        else:
            if positions.numel() and int(positions.max()) >= self.cos_sin_cache.shape[0]:
                raise ValueError(f"position {int(positions.max())} is beyond the RoPE cache "
                                 f"({self.cos_sin_cache.shape[0]} positions)")
            rows = self.cos_sin_cache.index_select(0, positions.long())
        return rows if dtype is None else rows.to(dtype)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor | None = None,
               cos_sin: torch.Tensor | None = None) -> torch.Tensor:
        """Rotate x [n, heads, head_size] at positions [n], or at 0..n-1 if positions is None, or by the rows
        `cos_sin` that `table` gave for them.

        Same arithmetic as SGLang's native rotary path, element for element (each
        product rounded, then summed), so rotated keys are bit-identical to the
        ones SGLang would have stored; written into one output to save passes.
        """
        if cos_sin is None:
            cos_sin = self.table(positions, x.shape[0])
        cos, sin = cos_sin.to(x.dtype).unsqueeze(-2).chunk(2, dim=-1)
        half = self.rotary_dim // 2
        if self.is_neox_style:
            x1, x2 = x[..., :half], x[..., half:self.rotary_dim]
        else:
            x1, x2 = x[..., 0:self.rotary_dim:2], x[..., 1:self.rotary_dim:2]
        out = torch.empty_like(x)
        if self.is_neox_style:
            o1, o2 = out[..., :half], out[..., half:self.rotary_dim]
        else:
            o1, o2 = out[..., 0:self.rotary_dim:2], out[..., 1:self.rotary_dim:2]
        torch.mul(x1, cos, out=o1)
        o1.sub_(x2 * sin)
        torch.mul(x2, cos, out=o2)
        o2.add_(x1 * sin)
        if self.rotary_dim < self.head_size:
            out[..., self.rotary_dim:] = x[..., self.rotary_dim:]
        return out

    def frequencies(self, tolerance: float = 1e-6) -> tuple[torch.Tensor, float] | None:
        """(inv_freq [rotary_dim/2] fp32, mscale) with cos(p * inv_freq) * mscale == the cache, or None.

        The GPU kernels then compute cos/sin on chip instead of reading the
        table. Read from the cache itself rather than from the rotary class, so
        every variant whose cache has that form qualifies (plain, llama3, YaRN),
        and one that does not (linear scaling divides positions first, which
        rounds differently) keeps the table. The frequency at position 1 is the
        angle itself; of it and its fp32 neighbours the one that reproduces the
        whole cache wins, and only within `tolerance` (about the fp32 rounding
        of a cos) is it offered.
        """
        cache = self.cos_sin_cache.detach().float().cpu()
        if cache.shape[0] < 2:
            return None
        half = self.rotary_dim // 2
        cos, sin = cache[:, :half], cache[:, half:]
        mscale = float(cos[0, 0])
        if mscale <= 0 or not torch.all(cos[0] == cos[0, 0]) or not torch.all(sin[0] == 0):
            return None
        angle = torch.atan2(sin[1].double(), cos[1].double()).float()
        candidates = [angle]
        for _ in range(2):
            candidates = [candidates[0].nextafter(torch.zeros_like(angle))] + candidates + \
                         [candidates[-1].nextafter(torch.full_like(angle, 10.0))]
        def error(inv_freq: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            freqs = rows.float()[:, None] * inv_freq[None, :]
            return torch.maximum((freqs.cos() * mscale - cos[rows]).abs(),
                                 (freqs.sin() * mscale - sin[rows]).abs()).amax(0)

        n = cache.shape[0]
        probe = torch.unique(torch.cat([torch.arange(min(n, 2048)), torch.arange(max(0, n - 2048), n)]))
        best, best_err = candidates[0], error(candidates[0], probe)
        for inv_freq in candidates[1:]:
            err = error(inv_freq, probe)
            better = err < best_err
            best, best_err = torch.where(better, inv_freq, best), torch.where(better, err, best_err)
        if float(error(best, torch.arange(n)).max()) > tolerance * max(mscale, 1.0):
            return None
        return best.to(self.cos_sin_cache.device), mscale

def cos_sin_cache(rotary_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """A plain RoPE cache, for tests and kernels' references."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def forward_keeping_keys_nope(original: Callable[..., Any], module: torch.nn.Module, positions: torch.Tensor,
                              query: torch.Tensor, key: torch.Tensor, *args: Any,
                              **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """`RotaryEmbedding.forward`: for a module the backend validated (`mepic_nope_key`), queries
    are rotated as usual and keys pass through unrotated, to be rotated in attention."""
    if not getattr(module, "mepic_nope_key", False):
        return original(module, positions, query, key, *args, **kwargs)
    # The original may rotate in place; give it a throwaway key.
    query, _ = original(module, positions, query, key.clone(), *args, **kwargs)
    return query, key
