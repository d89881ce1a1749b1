"""A CUDA stand-in for `sgl_kernel` (the sglang-kernel wheel), in torch and Triton.

Made for one path: SGLang 0.5.23 serving a dense Llama in bf16 on one GPU with the triton or
mepic attention backend, `--sampling-backend pytorch`, decode CUDA graphs (sglang-mepic's
GPU end-to-end run, eval/gpu/e2e). What the path calls is implemented with sgl_kernel's
signatures and semantics; every other name imports and raises NotImplementedError naming
itself when called; names SGLang probes for to choose a fallback are absent. README.md
(next to this package) has the table, with the SGLang call sites.
"""

from sgl_kernel import _stub
from sgl_kernel.elementwise import (
    FusedSetKVBufferArg,
    apply_rope_with_cos_sin_cache_inplace,
    fused_add_rmsnorm,
    gelu_and_mul,
    gelu_tanh_and_mul,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    rmsnorm,
    rotary_embedding,
    silu_and_mul,
)
from sgl_kernel.memory import weak_ref_tensor
from sgl_kernel.sampling import (
    top_k_renorm_prob,
    top_k_renorm_probs,
    top_p_renorm_prob,
    top_p_renorm_probs,
)
from sgl_kernel import kvcacheio, utils  # noqa: E402  (submodules SGLang imports by name)
from sgl_kernel.version import __version__

STANDIN = True  # so a log line or a check can tell this package from the real wheel

IMPLEMENTED = (
    "rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm",
    "silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul",
    "apply_rope_with_cos_sin_cache_inplace", "rotary_embedding", "FusedSetKVBufferArg",
    "weak_ref_tensor", "top_k_renorm_prob", "top_p_renorm_prob", "top_k_renorm_probs", "top_p_renorm_probs",
    "utils.is_arch_support_pdl", "utils.is_hopper_arch", "utils.get_cuda_stream",
    "kvcacheio.transfer_kv_per_layer", "kvcacheio.transfer_kv_per_layer_mla", "kvcacheio.transfer_kv_direct",
)

_stub.install_finder()
__getattr__ = _stub.module_getattr(
    __name__, implemented_submodules=("elementwise", "memory", "sampling", "kvcacheio", "utils", "version"))
