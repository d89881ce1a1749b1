"""sgl_kernel.utils: the helpers SGLang imports from it (`is_arch_support_pdl`, used by the
triton attention backend, layers/attention/triton_backend.py:71/340)."""

import functools
from typing import Dict, Tuple

import torch

from sgl_kernel._stub import module_getattr


def get_cuda_stream() -> int:
    return torch.cuda.current_stream().cuda_stream


@functools.lru_cache(maxsize=1)
def is_hopper_arch() -> bool:
    """Compute capability 9.x."""
    if torch.version.hip is not None or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(torch.cuda.current_device())[0] == 9


@functools.lru_cache(maxsize=1)
def is_arch_support_pdl() -> bool:
    """Programmatic dependent launch: CUDA compute capability >= 9, as in sgl_kernel (and in
    SGLang's own kernels/jit/utils/arch.py); False on ROCm or without a CUDA device. The
    triton backend then launches its decode kernels with launch_pdl, as with the real wheel."""
    if torch.version.hip is not None:
        return False
    try:
        return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= 9
    except Exception:
        return False


_cache_buf: Dict[Tuple[str, torch.device], torch.Tensor] = {}


def _get_cache_buf(name: str, bytes: int, device: torch.device) -> torch.Tensor:
    key = (name, device)
    buf = _cache_buf.get(key)
    if buf is None or buf.numel() < bytes:
        buf = torch.empty(bytes, dtype=torch.uint8, device=device)
        _cache_buf[key] = buf
    return buf


def _to_tensor_scalar_tuple(x):
    return (x, 0) if isinstance(x, torch.Tensor) else (None, x)


__getattr__ = module_getattr(__name__)
