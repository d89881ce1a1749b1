"""Keep keys NoPE for models served by the mepic attention backend (sglang_mepic.attention.rope).

The backend marks the rotary modules it has validated (`mepic_nope_key`); for
those, queries are rotated as usual and keys pass through unrotated, to be
rotated inside attention at each slot's position in the current request.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.attention import rope

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward"
HOOK_TYPE = HookType.AROUND

# Called per layer on every forward: the function itself, without a frame around it.
hook = rope.forward_keeping_keys_nope
