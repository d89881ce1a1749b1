"""RMSNorm, fused add-RMSNorm (plain and Gemma), activation-and-mul, RoPE: sgl_kernel's
signatures and in-place semantics, in torch (the reference, and the form used off CUDA) or
one Triton kernel each on CUDA (`_triton.py`).

Numerics follow the CUDA kernels (flashinfer's, which sgl_kernel wraps): inputs are read in
their dtype, all arithmetic is float32, each output is rounded once to its dtype. For
fused_add_rmsnorm the float32 sum is what gets normalised; `residual` receives it rounded.

Nothing here synchronises with the host (no .item(), .tolist(), nonzero, data-dependent
shapes), so every function can be captured in a CUDA graph.
"""

import os
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from sgl_kernel._stub import module_getattr

# auto: Triton for CUDA tensors when triton imports; torch: never; triton: always (CPU too,
# which needs TRITON_INTERPRET=1; the tests use it). Read per call, so tests can switch it.
BACKEND_ENV = "SGL_KERNEL_STANDIN_TRITON"
_BACKENDS = {"auto": "auto", "": "auto", "1": "triton", "triton": "triton", "0": "torch", "torch": "torch"}
_triton_module = None


def _triton():
    """The Triton kernels module, or None where triton cannot be imported."""
    global _triton_module
    if _triton_module is None:
        try:
            from sgl_kernel import _triton as module
        except Exception:  # no triton, or a triton that cannot initialise here
            module = False
        _triton_module = module
    return _triton_module or None


def _use_triton(*tensors) -> bool:
    mode = _BACKENDS.get(os.environ.get(BACKEND_ENV, "auto").strip().lower(), "auto")
    if mode == "torch":
        return False
    if mode == "auto" and not all(t.is_cuda for t in tensors):
        return False
    return _triton() is not None


def _rows(t: torch.Tensor) -> Optional[torch.Tensor]:
    """A 2-D view [rows, last dim] of `t` sharing its memory, with the last dim contiguous;
    None when no such view exists (the caller then uses the torch form)."""
    if t.dim() == 0 or t.stride(-1) != 1:
        return None
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------------------------
# RMSNorm


def _rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    x = x.float()
    w = weight.float() + 1.0 if gemma else weight.float()
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * w


def _rmsnorm(input, weight, eps, out, gemma):
    if out is None:
        out = torch.empty_like(input)
    if input.numel() == 0:
        return out
    if _use_triton(input, weight, out) and input.shape[-1] <= _triton().MAX_NORM_BLOCK:
        x2, o2 = _rows(input), _rows(out)
        if x2 is not None and o2 is not None and weight.is_contiguous():
            _triton().rmsnorm_rows(x2, weight, float(eps), o2, gemma=gemma)
            return out
    out.copy_(_rmsnorm_torch(input, weight, eps, gemma))
    return out


def _fused_add_rmsnorm(input, residual, weight, eps, gemma):
    if input.numel() == 0:
        return
    if _use_triton(input, residual, weight) and input.shape[-1] <= _triton().MAX_NORM_BLOCK:
        x2, r2 = _rows(input), _rows(residual)
        if x2 is not None and r2 is not None and weight.is_contiguous():
            _triton().rmsnorm_rows(x2, weight, float(eps), x2, residual=r2, gemma=gemma)
            return
    x = input.float() + residual.float()
    residual.copy_(x)
    input.copy_(_rmsnorm_torch(x, weight, eps, gemma))


def rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
            out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """out[i] = input[i] / RMS(input[i]) * weight; writes `out` when given, and returns it."""
    return _rmsnorm(input, weight, eps, out, gemma=False)


def fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float = 1e-6, enable_pdl: Optional[bool] = None) -> None:
    """In place: residual += input; input = residual / RMS(residual) * weight."""
    _fused_add_rmsnorm(input, residual, weight, eps, gemma=False)


def gemma_rmsnorm(input: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                  out: Optional[torch.Tensor] = None, enable_pdl: Optional[bool] = None) -> torch.Tensor:
    """out[i] = input[i] / RMS(input[i]) * (1 + weight)."""
    return _rmsnorm(input, weight, eps, out, gemma=True)


def gemma_fused_add_rmsnorm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            eps: float = 1e-6, enable_pdl: Optional[bool] = None) -> None:
    """In place: residual += input; input = residual / RMS(residual) * (1 + weight)."""
    _fused_add_rmsnorm(input, residual, weight, eps, gemma=True)


# ---------------------------------------------------------------------------------------------
# activation(x[..., :d]) * x[..., d:]


def _check_shape(input: torch.Tensor, output: torch.Tensor) -> None:
    assert input.ndim == output.ndim, f"{input.ndim} != {output.ndim}"
    assert input.shape[:-1] == output.shape[:-1], f"{input.shape[:-1]} != {output.shape[:-1]}"
    assert input.shape[-1] == 2 * output.shape[-1], f"{input.shape[-1]} != {2 * output.shape[-1]}"


_TORCH_ACT = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"),
}


def _act_and_mul(input: torch.Tensor, out: Optional[torch.Tensor], activation: str) -> torch.Tensor:
    if out is not None:
        _check_shape(input, out)
    else:
        out = torch.empty(input.shape[:-1] + (input.shape[-1] // 2,), device=input.device, dtype=input.dtype)
    if out.numel() == 0:
        return out
    if _use_triton(input, out):
        x2, o2 = _rows(input), _rows(out)
        if x2 is not None and o2 is not None:
            _triton().act_and_mul_rows(x2, o2, activation)
            return out
    d = input.shape[-1] // 2
    out.copy_(_TORCH_ACT[activation](input[..., :d].float()) * input[..., d:].float())
    return out


def silu_and_mul(input: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """silu(input[..., :d]) * input[..., d:], d = last dim / 2; into `out` when given."""
    return _act_and_mul(input, out, "silu")


def gelu_and_mul(input: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """gelu(input[..., :d]) * input[..., d:] (erf GELU)."""
    return _act_and_mul(input, out, "gelu")


def gelu_tanh_and_mul(input: torch.Tensor, out: torch.Tensor = None) -> torch.Tensor:
    """gelu_tanh(input[..., :d]) * input[..., d:]."""
    return _act_and_mul(input, out, "gelu_tanh")


# ---------------------------------------------------------------------------------------------
# Rotary embedding


@dataclass
class FusedSetKVBufferArg:
    """sgl_kernel's argument for storing K (after RoPE) and V into the KV cache at `cache_loc`."""

    value: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    k_scale: Optional[float]
    v_scale: Optional[float]
    cache_loc: torch.Tensor


def _rope_torch(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                rotary_dim: int, is_neox: bool) -> None:
    half = rotary_dim // 2
    cos_sin = cos_sin_cache.index_select(0, positions.long()).float()
    cos = cos_sin[:, None, :half]
    sin = cos_sin[:, None, half:rotary_dim]
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:rotary_dim]
    else:
        x1, x2 = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    f1, f2 = x1.float(), x2.float()
    o1 = f1 * cos - f2 * sin
    o2 = f2 * cos + f1 * sin
    x1.copy_(o1)
    x2.copy_(o2)


def _rope_inplace(x: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                  rotary_dim: int, is_neox: bool) -> None:
    """Rotate the first `rotary_dim` features of each head of x [tokens, heads, head_size]."""
    if x.numel() == 0:
        return
    if (_use_triton(x, positions, cos_sin_cache) and x.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
            and positions.is_contiguous()):
        _triton().rope_inplace(x, positions, cos_sin_cache, rotary_dim, is_neox)
        return
    _rope_torch(x, positions, cos_sin_cache, rotary_dim, is_neox)


def _view_3d(x: torch.Tensor, head_size: int) -> torch.Tensor:
    return x.view(x.shape[0], -1, head_size)


def apply_rope_with_cos_sin_cache_inplace(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    fused_set_kv_buffer_arg: Optional[FusedSetKVBufferArg] = None,
    enable_pdl: Optional[bool] = None,
) -> None:
    """RoPE on query [nnz, q_heads * head_size] and key [nnz, k_heads * head_size] in place, from
    cos_sin_cache [max_pos, rotary_dim] (float32: cos half, then sin half). is_neox: rotate the
    two halves of the first rotary_dim features; else the even/odd (GPT-J) pairs. With
    fused_set_kv_buffer_arg, also k_buffer[cache_loc] = rotated key, v_buffer[cache_loc] = value."""
    if cos_sin_cache.dtype != torch.float32:
        raise ValueError("cos_sin_cache should be float32")
    if (a := fused_set_kv_buffer_arg) is not None:
        assert a.k_scale is None, "k_scale is not yet supported"
        assert a.v_scale is None, "v_scale is not yet supported"
        assert a.cache_loc.dtype == torch.int64, f"{a.cache_loc.dtype=}"
    rotary_dim = cos_sin_cache.shape[-1]
    q, k = _view_3d(query, head_size), _view_3d(key, head_size)
    _rope_inplace(q, positions, cos_sin_cache, rotary_dim, is_neox)
    _rope_inplace(k, positions, cos_sin_cache, rotary_dim, is_neox)
    if a is not None:
        k_buffer, v_buffer = _view_3d(a.k_buffer, head_size), _view_3d(a.v_buffer, head_size)
        k_buffer[a.cache_loc] = k.to(k_buffer.dtype)
        v_buffer[a.cache_loc] = _view_3d(a.value, head_size).to(v_buffer.dtype)


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: Optional[torch.Tensor],
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool = True) -> None:
    """vLLM's `rotary_embedding` op, as SGLang's RotaryEmbedding fallback calls it
    (`fn(positions, query, key, head_size, cos_sin_cache, is_neox)`): in place on query/key
    [tokens, heads * head_size] or [tokens, heads, head_size]; the cache may be in any dtype
    (the fallback passes it in the query's), the math is float32."""
    rotary_dim = cos_sin_cache.shape[-1]
    positions = positions.reshape(-1)
    _rope_inplace(query.view(positions.shape[0], -1, head_size), positions, cos_sin_cache, rotary_dim, is_neox)
    if key is not None:
        _rope_inplace(key.view(positions.shape[0], -1, head_size), positions, cos_sin_cache, rotary_dim, is_neox)


__getattr__ = module_getattr(__name__)
