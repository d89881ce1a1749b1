"""Llama's MLP is built without SGLang's small-batch dual GEMM where its kernel package is missing.

On CUDA, SGLang 0.5.23 builds a `DualGemm` in every `LlamaMLP`, and its mode selection imports
`sglang.kernels.ops.gemm.cutedsl_dual_gemm`, which imports `cutlass` (nvidia-cutlass-dsl) before it
checks whether the GPU can run the kernel at all (SM100). Where that package is not installed, as
on a machine that got SGLang without its CUDA extras, model construction fails with ImportError.
The dual GEMM is an optional fast path (mode None: gate/up, SiLU-and-mul and down as usual), so
its absence turns it off, with one warning, instead of stopping the server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

if TYPE_CHECKING:
    from sglang.kernels.ops.gemm.cutedsl_dual_gemm import DualGemmQuantMode
    from sglang.srt.layers.dual_gemm import DualGemm

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.layers.dual_gemm.DualGemm._select_mode"
HOOK_TYPE = HookType.AROUND

logger = logging.getLogger(__name__)
_warned = False


def hook(original: Callable[..., Any], dual_gemm: DualGemm, *args: Any, **kwargs: Any) -> DualGemmQuantMode | None:
    global _warned
    try:
        return original(dual_gemm, *args, **kwargs)
    except ImportError as e:
        if not _warned:
            logger.warning("SGLang's dual GEMM is off: its kernel cannot be imported (%s)", e)
            _warned = True
        return None
