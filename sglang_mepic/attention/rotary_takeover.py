"""At start-up: whether the mepic backend can serve the model, and its RoPE taken over.

The backend rotates each key at its slot's position at attention time, so the model's rotary modules must
leave keys unrotated (NoPE) in the pool: each is marked `mepic_nope_key`, which the
`rotary_embedding_forward` patch reads. That is sound only for the architectures this backend validated and
for one RoPE shared by every layer, which is checked here before the mark is set."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from sglang_mepic.attention.rope import Rope, UnsupportedRope

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

# launch/checks.py names them too (MEPIC_ARCHITECTURES), without importing SGLang; tests/launch checks they agree.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def rotary_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for name, m in model.named_modules() if name.endswith("rotary_emb")]


def take_over_rotary(model_runner: ModelRunner) -> Rope:
    """The model's one RoPE, its rotary modules set to leave keys unrotated; UnsupportedRope for a model this
    backend cannot serve (another architecture, a sliding window, no RoPE, or layers with different ones)."""
    hf_config = model_runner.model_config.hf_config
    archs = getattr(hf_config, "architectures", None) or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise UnsupportedRope(f"--attention-backend mepic supports {', '.join(SUPPORTED_ARCHITECTURES)}; "
                              f"this model is {archs}")
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", True):
        raise UnsupportedRope("--attention-backend mepic does not support sliding-window attention")
    modules = rotary_modules(model_runner.model)
    if not modules:
        raise UnsupportedRope("--attention-backend mepic needs a model with rotary position embedding; "
                              "none was found")
    ropes = [Rope.from_module(m) for m in modules]
    first = ropes[0]
    shape = (first.rotary_dim, first.head_size, first.is_neox_style)
    for r in ropes[1:]:
        if (r.rotary_dim, r.head_size, r.is_neox_style) != shape or not torch.equal(r.cos_sin_cache,
                                                                                    first.cos_sin_cache):
            raise UnsupportedRope("--attention-backend mepic needs one RoPE for all layers")
    for m in modules:
        m.mepic_nope_key = True
    logger.info("mepic attention: NoPE keys, RoPE %s-style, rotary_dim %d of %d",
                "neox" if first.is_neox_style else "gptj", first.rotary_dim, first.head_size)
    return first
