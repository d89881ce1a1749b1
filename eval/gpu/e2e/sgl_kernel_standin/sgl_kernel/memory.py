"""`weak_ref_tensor`: a tensor over another tensor's memory that does not keep it alive.

SGLang's breakable CUDA graphs (the default prefill graphs on CUDA for the triton backend)
and the piecewise CUDA-graph backend hand captured intermediates through
`runner_backend_utils/weak_ref_tensor.py`, so the graph pool can reuse their memory; the
real op is `torch::from_blob(data_ptr, sizes, strides)`. Here, the same with torch's own
non-owning storage constructor (the one torch's cudagraph trees use).
"""

import torch

from sgl_kernel._stub import module_getattr


def _extent_bytes(tensor: torch.Tensor) -> int:
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


def weak_ref_tensor(tensor):
    """A tensor with `tensor`'s data pointer, sizes, strides, dtype and device, whose storage
    does not own the memory: it stays valid only while something else keeps it allocated."""
    if not isinstance(tensor, torch.Tensor):
        return tensor
    if any(stride < 0 for stride in tensor.stride()):
        raise ValueError("weak_ref_tensor: negative strides are not supported")
    storage = torch._C._construct_storage_from_data_pointer(tensor.data_ptr(), tensor.device,
                                                            _extent_bytes(tensor))
    view = torch.empty((0,), dtype=tensor.dtype, device=tensor.device)
    view.set_(storage, 0, tensor.size(), tensor.stride())
    return view


__getattr__ = module_getattr(__name__)
