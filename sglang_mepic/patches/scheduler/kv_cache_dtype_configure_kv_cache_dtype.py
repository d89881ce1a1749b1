"""Under the mepic attention backend the CPU keeps an fp8_e5m2 KV cache, as a GPU does.

SGLang 0.5.23 refuses `--kv-cache-dtype fp8_e5m2` on the CPU (in the scheduler, once the model has
loaded), and keeps e4m3 there only quantized its own way for its intel_amx backend: none of its CPU
attention backends reads a plain fp8 pool. The mepic backend does, on any device (a key widened,
its scale multiplied back, then rotated: `attention/backend.py`), so under it the CPU gets the pool
SGLang builds on a GPU for the flag: float8_e5m2 values stored as uint8. Nothing else changes: the
launcher still refuses e4m3 on the CPU, and another backend still meets SGLang's own refusal.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.mem_cache.kv_cache_dtype.configure_kv_cache_dtype"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[str | None, torch.dtype]:
    if kwargs.get("server_args_kv_cache_dtype") == "fp8_e5m2" and not kwargs.get("is_draft_worker"):
        from sglang.srt.platforms import current_platform
        from sglang.srt.runtime_context import attention_backends

        if current_platform.is_cpu() and set(attention_backends()) == {"mepic"}:
            return None, torch.float8_e5m2  # what the GPU branch resolves the flag to
    return original(*args, **kwargs)
