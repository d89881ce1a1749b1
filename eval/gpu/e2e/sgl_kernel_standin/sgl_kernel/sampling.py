"""Top-k / top-p renormalisation of probability rows (sgl_kernel's `top_k_renorm_prob`,
`top_p_renorm_prob`), in torch.

SGLang's sampler imports both on CUDA (layers/sampler.py:40) but calls them only with
`--sampling-backend flashinfer`; the device run passes `pytorch`. They are implemented
anyway, with the threshold semantics of SGLang's own Triton port of FlashInfer's kernels
(kernels/ops/sampling/renorm_triton.py): a row keeps every probability >= its pivot (ties at
the pivot kept) and is divided by the kept sum; results are float32. No host sync.
"""

from typing import Union

import torch

from sgl_kernel._stub import module_getattr


def _per_row(value, batch_size: int, device, dtype, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        value = value.to(device=device, dtype=dtype).reshape(-1)
        if value.numel() == 1:
            return value.expand(batch_size)
        if value.numel() != batch_size:
            raise ValueError(f"{name} must be scalar or have one value per row, got "
                             f"{value.numel()} values for {batch_size} rows")
        return value
    return torch.full((batch_size,), value, device=device, dtype=dtype)


def _as_rows(probs: torch.Tensor) -> torch.Tensor:
    """The renorms' input check: one row of probabilities per request, in float32."""
    if probs.ndim != 2:
        raise ValueError(f"probs must be 2D, got shape={tuple(probs.shape)}")
    return probs.float()


def _renorm_from_pivots(probs: torch.Tensor, pivots: torch.Tensor) -> torch.Tensor:
    kept = torch.where(probs >= pivots[:, None], probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    return kept / kept.sum(dim=-1, keepdim=True)


def top_k_renorm_probs(probs: torch.Tensor, top_k: Union[torch.Tensor, int]) -> torch.Tensor:
    """Keep each row's top_k largest probabilities (all ties of the k-th kept) and renormalise."""
    probs = _as_rows(probs)
    batch_size, vocab_size = probs.shape
    if batch_size == 0 or vocab_size == 0:
        return probs.clone()
    top_ks = _per_row(top_k, batch_size, probs.device, torch.int64, "top_k")
    sorted_probs = torch.sort(probs, dim=-1, descending=True).values
    cutoff = (top_ks - 1).clamp(min=0, max=vocab_size - 1)
    pivots = sorted_probs.gather(1, cutoff[:, None]).squeeze(1)
    return _renorm_from_pivots(probs, pivots)


def top_p_renorm_probs(probs: torch.Tensor, top_p: Union[torch.Tensor, float]) -> torch.Tensor:
    """Keep the smallest set of largest probabilities whose mass reaches top_p (ties at the
    threshold kept) and renormalise: ascending sort, drop the prefix whose cumulative mass
    is below 1 - top_p."""
    probs = _as_rows(probs)
    batch_size, vocab_size = probs.shape
    if batch_size == 0 or vocab_size == 0:
        return probs.clone()
    if not isinstance(top_p, torch.Tensor) and not 0.0 < float(top_p) <= 1.0:
        raise ValueError("top_p values must be in (0, 1]")
    top_ps = _per_row(top_p, batch_size, probs.device, torch.float32, "top_p")
    sorted_probs = torch.sort(probs, dim=-1).values
    cdf = torch.cumsum(sorted_probs, dim=-1)
    cutoff = torch.searchsorted(cdf, (1.0 - top_ps)[:, None].contiguous(), right=False).squeeze(1)
    cutoff = cutoff.clamp(max=vocab_size - 1)
    pivots = sorted_probs.gather(1, cutoff[:, None]).squeeze(1)
    return _renorm_from_pivots(probs, pivots)


top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs

__getattr__ = module_getattr(__name__)
