"""The KV cache dtypes the mepic backend reads, and the scales it reads them with.

A float pool, or SGLang's fp8 pool (stored as uint8, read through a float8 view) with its per-layer k/v
scales. Both the torch path and the kernels read these; the backend asks once, at start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import KVCache

FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_kv_dtype(token_to_kv_pool: KVCache) -> torch.dtype:
    """The pool's KV dtype (its logical one: SGLang stores fp8 as uint8), or refuse a pool this backend cannot
    read: one SGLang quantizes with block scales of its own (`is_quantized_kv_cache`: fp4, mxfp8), an fp8 format
    but e4m3fn/e5m2, or no float at all."""
    dtype = getattr(token_to_kv_pool, "dtype", None)
    if dtype is None and hasattr(token_to_kv_pool, "get_key_buffer"):
        dtype = token_to_kv_pool.get_key_buffer(0).dtype
    readable = dtype is not None and (dtype in FP8_KV_DTYPES or dtype.is_floating_point and dtype.itemsize >= 2)
    if getattr(token_to_kv_pool, "is_quantized_kv_cache", False) or not readable:
        raise ValueError(f"--attention-backend mepic cannot read a {dtype} KV cache"
                         f"{' quantized with block scales' if readable else ''}: use --kv-cache-dtype auto, bf16, "
                         "fp8_e4m3 or fp8_e5m2")
    return dtype


def kv_scales(layer: torch.nn.Module, fp8_pool: bool) -> tuple[float, float]:
    """What the pool's keys and values are multiplied by when read: the layer's scales when both are set and the
    pool is fp8 (SGLang's pool divides by them only when it casts to fp8: a checkpoint's scales over a bf16 cache
    leave it unscaled), else 1. As host floats: SGLang keeps a checkpoint's as `k_scale_float`, and a
    `--quantization-param-path` file's as `k_scale` itself, a float; a tensor is read once (`MepicAttnBackend`
    asks before any forward)."""
    k, v = getattr(layer, "k_scale", None), getattr(layer, "v_scale", None)
    if not fp8_pool or k is None or v is None:
        return 1.0, 1.0
    k_float, v_float = getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None)
    return float(k if k_float is None else k_float), float(v if v_float is None else v_float)
