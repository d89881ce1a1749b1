"""The `mepic` radix-cache backend (`--radix-cache-backend mepic`).

It extends SGLang's Python `RadixCache` rather than the default
`UnifiedRadixCache`: the unified tree keeps its nodes in a Rust core that a
plugin cannot give a new node kind, while the Python tree is a plain class whose
insert/match/evict paths can be extended in Python. For a request without chunk
markup it is SGLang's own `RadixCache`, unchanged.
"""

import logging

from sglang.srt.mem_cache.radix_cache import RadixCache

logger = logging.getLogger(__name__)

BACKEND_NAME = "mepic"


class MepicRadixCache(RadixCache):
    pass


def build(ctx) -> MepicRadixCache:
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError("--radix-cache-backend mepic supports full-attention models only "
                         "(no sliding-window or state-space layers)")
    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend mepic does not support --enable-hierarchical-cache")
    params = ctx.params
    if ctx.disable_radix_cache:
        params.disable = True
    return MepicRadixCache(params)
