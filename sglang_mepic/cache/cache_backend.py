"""The `mepic` radix-cache backend's factory: settings checked at start-up, then the cache.

`plugin.py` registers `build` with SGLang under `BACKEND_NAME` (`--radix-cache-backend mepic`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_mepic import env, modes
from sglang_mepic.cache import metrics
from sglang_mepic.cache.radix_cache import MepicRadixCache
from sglang_mepic.tiers import weights

if TYPE_CHECKING:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext

BACKEND_NAME = "mepic"


def quantization_param_path() -> str | None:
    """SGLang's `--quantization-param-path` (the KV scales file of an fp8 cache), where the process has one."""
    from sglang.srt.runtime_context import get_model

    try:
        return getattr(get_model(), "quantization_param_path", None)
    except ValueError:  # not published in this process
        return None


def model_fingerprint(model_config: ModelConfig, scales_path: str | None = None, stored: bool = False) -> str:
    """What makes KV reusable: the weights (path, revision), their dtype and the architecture.

    `stored`: with a storage backend, chunk KV outlives this process: weights replaced in the same
    folder (a fine-tune saved over the original) must not read the old weights' KV, so the
    folder's contents are hashed too (weights.py; paid once at start, and only then). So is
    `scales_path`, SGLang's `--quantization-param-path`: the KV scales an fp8 cache is stored under."""
    hf = getattr(model_config, "hf_config", None)
    described = json.dumps(hf.to_dict() if hf is not None else {}, sort_keys=True, default=str)
    path = str(getattr(model_config, "model_path", ""))
    parts = [path, str(getattr(model_config, "revision", "")), str(getattr(model_config, "dtype", "")), described]
    if stored and os.path.isdir(path):
        parts.append(weights.digest(path))
    if scales_path:
        parts.append(weights.file_digest(Path(scales_path)) if os.path.isfile(scales_path) else scales_path)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def build(ctx: TreeCacheBuildContext) -> MepicRadixCache:
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError("--radix-cache-backend mepic supports full-attention models only "
                         "(no sliding-window or state-space layers)")
    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend mepic does not support --enable-hierarchical-cache")
    settings = env.settings()  # read at the process's start: a bad setting fails here
    directory = settings.storage_dir if settings.storage_backend == "file" else None
    if directory is not None:
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise ValueError(f"--mepic-storage-dir {directory}: cannot create it ({e.strerror})") from None
        if not os.access(directory, os.W_OK):
            raise ValueError(f"--mepic-storage-dir {directory}: not writable")
    mode = settings.mode
    modes.canonical_from(mode, settings.recompute_blocks)  # a bad --mepic-recompute-blocks fails here
    metrics.publish_reuse_refused(mode.name, settings.reuse_refused)
    if ctx.disable_radix_cache and mode.reuses:
        raise ValueError(f"--mepic-mode {mode.name} needs the radix cache: drop --disable-radix-cache "
                         "or use --mepic-mode full")
    params = ctx.params
    if ctx.disable_radix_cache:
        params.disable = True
    fingerprint = model_fingerprint(ctx.model_config, quantization_param_path(),
                                    stored=settings.storage_backend not in (None, "none"))
    return MepicRadixCache(params, fingerprint, mode, settings=settings)
