"""Keep keys NoPE for models served by the mepic attention backend.

The backend marks the rotary modules it has validated (`mepic_nope_key`); for
those, queries are rotated as usual and keys pass through unrotated, to be
rotated inside attention at each slot's position in the current request.
"""

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward"
HOOK_TYPE = HookType.AROUND


def hook(original, module, positions, query, key, *args, **kwargs):
    if not getattr(module, "mepic_nope_key", False):
        return original(module, positions, query, key, *args, **kwargs)
    # The original may rotate in place; give it a throwaway key.
    query, _ = original(module, positions, query, key.clone(), *args, **kwargs)
    return query, key
