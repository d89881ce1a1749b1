"""The `mepic` radix-cache backend (`--radix-cache-backend mepic`).

It extends SGLang's Python `RadixCache` rather than the default
`UnifiedRadixCache`: the unified tree keeps its nodes in a Rust core that a
plugin cannot give a new node kind, while the Python tree is a plain class whose
paths can be extended in Python. For a request without chunk markup it is
SGLang's own `RadixCache`, unchanged.

For a request with chunks the tree is keyed by the request's padded slot
tokens (pads are `PAD_ID`, never a real token id), so prompt pages and each
chunk's request-specific first block are cached by prefix as usual, and the
nodes past a chunk's first block hold its canonical pages, the same physical
pages the chunk store holds. An identical request matches all the way through;
a request with the same chunks in another order matches the common prefix and
then finds its chunks in the store (`plan`).

Pages are shared between the store, tree nodes and running requests, so the
cache attaches a `PageRefs` to SGLang's allocator: every release there drops one
holder (patch `paged_allocator_release_page_ids`).
"""

import hashlib
import json
import logging
from array import array

from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey

from sglang_mepic import config
from sglang_mepic.chunk_store import ChunkStore
from sglang_mepic.pages import PageRefs
from sglang_mepic.plan import Plan, Source, make_plan
from sglang_mepic.pool_pages import PoolPages
from sglang_mepic.request_layout import masked_key, pad_runs
from sglang_mepic.segments import Kind, Layout, chunk_hash

logger = logging.getLogger(__name__)

BACKEND_NAME = "mepic"


class MepicRadixCache(RadixCache):
    def __init__(self, params, model_fingerprint: str = "", recompute_blocks: int | None = 1):
        super().__init__(params)
        self.model_fingerprint = model_fingerprint
        self.recompute_blocks = recompute_blocks
        self.pages = PoolPages(params.token_to_kv_pool_allocator)
        self.refs = PageRefs(self.pages)
        params.token_to_kv_pool_allocator.mepic_refs = self.refs
        self.store = ChunkStore(self.refs)

    # Requests laid out in slots (request_layout): their pad slots key as PAD_ID.

    def match_prefix(self, params):
        runs = pad_runs(getattr(params.req, "kv_hints", None))
        if runs:
            key = params.key
            params.key = RadixKey(array("q", masked_key(key.token_ids, runs)), key.extra_key,
                                  is_bigram=key.is_bigram, limit=key.limit, cache_salt=key.cache_salt)
        return super().match_prefix(params)

    def _insert_cache(self, req, token_ids, **kwargs):
        runs = pad_runs(req.kv_hints)
        if runs:
            token_ids = array("q", masked_key(token_ids, runs))
        return super()._insert_cache(req, token_ids, **kwargs)

    def key_for(self, layout: Layout, namespace: str | None) -> RadixKey:
        return RadixKey(array("q", layout.slot_tokens()), extra_key=namespace)

    def chunk_keys(self, layout: Layout, namespace: str | None) -> dict[int, str]:
        return {i: chunk_hash(seg, layout.placement, layout.page_size, self.model_fingerprint, namespace)
                for i, seg in enumerate(layout.segments) if seg.kind is Kind.CHUNK}

    def plan(self, layout: Layout, namespace: str | None) -> Plan:
        """Match the tree, resolve the rest of the chunks through the store, and take a
        reference on every shared page the request will read (release them with the row)."""
        if layout.page_size != self.page_size:
            raise ValueError(f"layout page size {layout.page_size} != pool page size {self.page_size}")
        match = self.match_prefix(MatchPrefixParams(key=self.key_for(layout, namespace)))
        keys = self.chunk_keys(layout, namespace)
        resident = {}
        for i, key in keys.items():
            if layout.segments[i].end > match.device_prefix_len and key not in resident:
                pages = self.store.lookup(key)
                if pages is not None:
                    resident[key] = pages
        plan = make_plan(layout, keys, match.device_prefix_len, resident, self.recompute_blocks)
        self.refs.acquire(p.page for p in plan.pages if p.source is Source.SHARED)
        return plan

    def publish(self, key: str, pages) -> tuple[int, ...]:
        """A compiled chunk's canonical pages join the store (which takes its own reference)."""
        return self.store.put(key, tuple(pages))

    def reset(self):
        # SGLang clears the allocator right after resetting the tree (flush_cache), so
        # the store and the counts are dropped, not released page by page.
        super().reset()
        if getattr(self, "store", None) is not None:
            self.store.forget()
            self.refs.forget()


def model_fingerprint(model_config) -> str:
    """What makes KV reusable: the weights (path, revision), their dtype and the architecture."""
    hf = getattr(model_config, "hf_config", None)
    described = json.dumps(hf.to_dict() if hf is not None else {}, sort_keys=True, default=str)
    parts = [str(getattr(model_config, "model_path", "")), str(getattr(model_config, "revision", "")),
             str(getattr(model_config, "dtype", "")), described]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def build(ctx) -> MepicRadixCache:
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm:
        raise ValueError("--radix-cache-backend mepic supports full-attention models only "
                         "(no sliding-window or state-space layers)")
    if ctx.enable_hierarchical_cache:
        raise ValueError("--radix-cache-backend mepic does not support --enable-hierarchical-cache")
    config.placement()  # fail at start-up on a bad SGLANG_MEPIC_PLACEMENT
    params = ctx.params
    if ctx.disable_radix_cache:
        params.disable = True
    return MepicRadixCache(params, model_fingerprint(ctx.model_config))
