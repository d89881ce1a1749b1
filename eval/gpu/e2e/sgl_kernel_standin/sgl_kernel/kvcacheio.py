"""sgl_kernel.kvcacheio: KV copies between the device pool and SGLang's HiCache host pool.

On SGLang 0.5.23's CUDA path the host pools import twelve of these at module level
(mem_cache/pool_host/mha.py:61, memory_pool_host.py:45, ...), so all must import. Our host
tier (sglang_mepic/tiers/levels.py) constructs `MHATokenToKVPoolHost` but copies with tensor
indexing itself, calling none of them; SGLang's own radix cache calls them only with
`--enable-hierarchical-cache`, which the run does not pass. Implemented here are the ones
that take tensors (the layer-first `kernel` and `direct` transfers of an MHA/MLA pool), in
torch; the ones that take tables of raw data pointers (`*_all_layer*` of the `kernel` io
backend) or the page-first layouts are stubs that raise NotImplementedError when called.

Absent on purpose (ImportError, so SGLang takes its fallback): get_device_accessible_ptr
(pool_host/common.py:400: raw host addresses, which CUDA's UVA makes device-accessible) and
transfer_embedding_ranges_direct (embedding_cache_controller.py:15).
"""

from typing import List

import torch

from sgl_kernel._stub import module_getattr


def _rows(t: torch.Tensor, item_size: int, name: str) -> torch.Tensor:
    rows = t.reshape(t.shape[0], -1) if t.dim() != 2 else t
    if rows.data_ptr() != t.data_ptr() or rows.shape[1] * rows.element_size() != item_size:
        raise ValueError(f"{name}: rows of {tuple(t.shape)} {t.dtype} are not {item_size}-byte packed rows")
    return rows


def _copy_rows(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor, dst_indices: torch.Tensor) -> None:
    src_indices = src_indices.to(src.device, torch.int64)
    dst_indices = dst_indices.to(dst.device, torch.int64)
    dst.index_copy_(0, dst_indices, src.index_select(0, src_indices).to(dst.device, dst.dtype))


def transfer_kv_per_layer(src_k: torch.Tensor, dst_k: torch.Tensor, src_v: torch.Tensor, dst_v: torch.Tensor,
                          src_indices: torch.Tensor, dst_indices: torch.Tensor, item_size: int,
                          block_quota: int = 2, num_warps_per_block: int = 32) -> None:
    """dst_k[dst_indices[i]] = src_k[src_indices[i]] (rows of item_size bytes), and the same for v."""
    for name, src, dst in (("k", src_k, dst_k), ("v", src_v, dst_v)):
        _copy_rows(_rows(src, item_size, f"src_{name}"), _rows(dst, item_size, f"dst_{name}"), src_indices,
                   dst_indices)


def transfer_kv_per_layer_mla(src: torch.Tensor, dst: torch.Tensor, src_indices: torch.Tensor,
                              dst_indices: torch.Tensor, item_size: int, block_quota: int = 2,
                              num_warps_per_block: int = 32) -> None:
    """dst[dst_indices[i]] = src[src_indices[i]] (rows of item_size bytes)."""
    _copy_rows(_rows(src, item_size, "src"), _rows(dst, item_size, "dst"), src_indices, dst_indices)


def transfer_kv_direct(src_layers: List[torch.Tensor], dst_layers: List[torch.Tensor], src_indices: torch.Tensor,
                       dst_indices: torch.Tensor, page_size: int) -> None:
    """For each layer pair, dst[dst_indices[i]] = src[src_indices[i]] along the first (token) dim."""
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers, {len(dst_layers)} destination")
    if src_indices.numel() != dst_indices.numel():
        raise ValueError("transfer_kv_direct: source and destination indices differ in length")
    for src, dst in zip(src_layers, dst_layers):
        _copy_rows(src, dst, src_indices, dst_indices)


__getattr__ = module_getattr(__name__)
