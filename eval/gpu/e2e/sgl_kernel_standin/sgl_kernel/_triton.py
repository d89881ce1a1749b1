"""Triton forms of the row kernels (RMSNorm, fused add-RMSNorm, SiLU-and-mul, RoPE).

Each replaces a chain of 6-10 eager torch kernels by one launch: under decode CUDA graphs
the chain costs a few microseconds per kernel, x 2 norms x 32 layers per step. The torch
forms in elementwise.py stay the reference and the fallback (CPU, shapes these kernels do
not take, SGL_KERNEL_STANDIN_TRITON=0). All math in float32, one rounding to the output
dtype, as the CUDA kernels of sgl_kernel/flashinfer do. Tested on CPU under
TRITON_INTERPRET=1 (tests/tooling/test_sgl_kernel_standin.py).
"""

import triton
import triton.language as tl

MAX_NORM_BLOCK = 32768


@triton.jit
def _rmsnorm_kernel(x_ptr, x_stride, res_ptr, res_stride, w_ptr, out_ptr, out_stride, n_cols, eps,
                    HAS_RESIDUAL: tl.constexpr, GEMMA: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x = x + tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * res_stride + cols, x.to(res_ptr.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        w = w + 1.0
    tl.store(out_ptr + row * out_stride + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def _norm_warps(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


def rmsnorm_rows(x, weight, eps, out, residual=None, gemma=False):
    """Rows of the 2-D `x` (last dim contiguous) normalised into `out`; with `residual`,
    residual += x first (in place) and the sum is what is normalised."""
    n_rows, n_cols = x.shape
    if n_rows == 0:
        return
    block = triton.next_power_of_2(n_cols)
    res = residual if residual is not None else x
    _rmsnorm_kernel[(n_rows,)](
        x, x.stride(0), res, res.stride(0), weight, out, out.stride(0), n_cols, eps,
        HAS_RESIDUAL=residual is not None, GEMMA=gemma, BLOCK=block, num_warps=_norm_warps(block))


@triton.jit
def _act_and_mul_kernel(x_ptr, x_stride, out_ptr, out_stride, d, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    a = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0).to(tl.float32)
    if ACT == 0:  # silu
        g = a / (1.0 + tl.exp(-a))
    elif ACT == 1:  # gelu (erf)
        g = 0.5 * a * (1.0 + tl.erf(a * 0.7071067811865476))
    else:  # gelu, tanh approximation
        inner = 0.7978845608028654 * (a + 0.044715 * a * a * a)
        g = 0.5 * a * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0))
    tl.store(out_ptr + row * out_stride + cols, (g * b).to(out_ptr.dtype.element_ty), mask=mask)


ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}


def act_and_mul_rows(x, out, activation):
    n_rows, two_d = x.shape
    d = two_d // 2
    if n_rows == 0 or d == 0:
        return
    block = min(1024, triton.next_power_of_2(d))
    _act_and_mul_kernel[(n_rows, triton.cdiv(d, block))](
        x, x.stride(0), out, out.stride(0), d, ACT=ACTIVATIONS[activation], BLOCK=block, num_warps=4)


@triton.jit
def _rope_kernel(x_ptr, stride_t, stride_h, pos_ptr, cs_ptr, cs_stride, n_heads,
                 HALF: tl.constexpr, IS_NEOX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    r = tl.arange(0, BLOCK_R)
    rmask = r < HALF
    pos = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cs_ptr + pos * cs_stride + r, mask=rmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * cs_stride + HALF + r, mask=rmask, other=0.0).to(tl.float32)
    if IS_NEOX:
        i1 = r
        i2 = r + HALF
    else:
        i1 = 2 * r
        i2 = 2 * r + 1
    mask = (heads < n_heads)[:, None] & rmask[None, :]
    base = x_ptr + t * stride_t + heads.to(tl.int64)[:, None] * stride_h
    x1 = tl.load(base + i1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(base + i2[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(base + i1[None, :], o1.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(base + i2[None, :], o2.to(x_ptr.dtype.element_ty), mask=mask)


def rope_inplace(x, positions, cos_sin_cache, rotary_dim, is_neox):
    """Rotate the first `rotary_dim` features of each head of the 3-D view `x`
    ([tokens, heads, head_size], last dim contiguous) in place."""
    n_tokens, n_heads, _ = x.shape
    if n_tokens == 0 or n_heads == 0:
        return
    half = rotary_dim // 2
    block_h = min(16, triton.next_power_of_2(n_heads))
    _rope_kernel[(n_tokens, triton.cdiv(n_heads, block_h))](
        x, x.stride(0), x.stride(1), positions, cos_sin_cache, cos_sin_cache.stride(0), n_heads,
        HALF=half, IS_NEOX=bool(is_neox), BLOCK_H=block_h, BLOCK_R=triton.next_power_of_2(half), num_warps=4)
