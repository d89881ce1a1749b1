"""RoPE applied to keys at attention time, from the model's own cos/sin cache.

Keys are stored without rotary embedding (NoPE) and rotated here at the
position each key has in the current request. Every supported variant is a
`RotaryEmbedding` whose scaling (linear, llama3, YaRN with its mscale) is baked
into `cos_sin_cache`, so one rotation covers them all: neox or gptj pairing,
and partial rotary (`rotary_dim < head_size`, the tail passes through).
Anything else is refused when the server starts, never approximated.
"""

from dataclasses import dataclass

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
    def from_module(cls, module) -> "Rope":
        name = type(module).__name__
        if name not in SUPPORTED:
            raise UnsupportedRope(
                f"the mepic attention backend cannot rotate keys for {name}; supported: {', '.join(SUPPORTED)}")
        if getattr(module, "position_start", 0):
            raise UnsupportedRope(f"{name} with position_start={module.position_start} is not supported")
        if module.rotary_dim % 2 or module.rotary_dim > module.head_size:
            raise UnsupportedRope(f"rotary_dim {module.rotary_dim} does not fit head size {module.head_size}")
        return cls(module.cos_sin_cache, module.rotary_dim, module.head_size, module.is_neox_style)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [n, heads, head_size] at positions [n] (same arithmetic as SGLang's native path)."""
        if positions.numel() and int(positions.max()) >= self.cos_sin_cache.shape[0]:
            raise ValueError(f"position {int(positions.max())} is beyond the RoPE cache "
                             f"({self.cos_sin_cache.shape[0]} positions)")
        cos, sin = self.cos_sin_cache.index_select(0, positions.long()).chunk(2, dim=-1)
        cos = cos.unsqueeze(-2).to(x.dtype)
        sin = sin.unsqueeze(-2).to(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim:]
        if self.is_neox_style:
            x1, x2 = rot.chunk(2, dim=-1)
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        out = torch.cat((o1, o2), dim=-1) if self.is_neox_style else torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def cos_sin_cache(rotary_dim: int, max_positions: int, base: float = 10000.0) -> torch.Tensor:
    """A plain RoPE cache, for tests and kernels' references."""
    inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)
