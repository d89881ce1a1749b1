"""What the cache reports: each request's figures (its `wire.report.Report`, which becomes its
response's `mepic_*` meta_info) and the cache's totals (/metrics, /server_info, the eval harness)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from sglang_mepic import modes
from sglang_mepic.cache import metrics
from sglang_mepic.wire.report import Report

if TYPE_CHECKING:
    from sglang_mepic.cache.compile_rows import CompileRows
    from sglang_mepic.cache.link import Link
    from sglang_mepic.cache.planner import Planned
    from sglang_mepic.pages.chunk_store import ChunkStore
    from sglang_mepic.pages.ledger import Ledger
    from sglang_mepic.pages.pool_pages import PoolPages
    from sglang_mepic.pages.refs import PageRefs
    from sglang_mepic.tiers.levels import Tiers


PUBLISH_EVERY_S = 0.5  # while requests run, /metrics is brought up to date at most this often
clock = time.monotonic


@dataclass
class Counters:
    recomputed_tokens: int = 0   # chunk and prompt tokens computed in a request's context
    reused_tokens: int = 0       # chunk tokens served from the store (shared or copied)
    compiled_chunks: int = 0     # compile rows that produced new canonical pages
    compiled_tokens: int = 0     # real tokens computed by compile rows
    requests_received: int = 0   # generate requests the scheduler received (patch scheduler_handle_generate_request)
    private_copy_fallbacks: int = 0  # epic requests that read stored pages in place for lack of room


def compiled_reuse(link: Link, canonical_from: int, page_size: int) -> int:
    """Real tokens the request reuses from chunks that compile rows in its own batch computed.

    The plan reuses them like stored chunks, but they were computed for this request:
    neither a cache hit nor a recompute in context.
    """
    plan = link.planned.plan if link.planned is not None else None
    if plan is None or not link.compiled:
        return 0
    real = link.shape.real_per_page(page_size)
    reused = set(plan.order[:len(plan.reused)])
    total = 0
    for i in set(link.compiled):
        if i < len(link.chunk_slots):
            start, end = link.chunk_slots[i]
            total += sum(real[p] for p in range(start // page_size + canonical_from, end // page_size) if p in reused)
    return total


def count_admitted(link: Link, prefix_len: int, counters: Counters, mode: modes.Mode, canonical_from: int,
                   page_size: int, plan_hits: int) -> None:
    """Fill the admitted request's report and add it to the totals."""
    prefix = min(prefix_len, link.size)
    if link.compile:
        computed = link.real_slots(prefix, link.size)
        counters.compiled_tokens += computed
        found = cast(list[str], link.found)  # planned: found is set
        link.report = Report(compiled_tokens=computed, residency=[found[0]])
        return
    substituted = 0
    if link.sources is not None:  # CacheBlend: its selected fraction is computed after all
        substituted = sum(1 for s in link.sources[prefix_len:] if s >= 0)
        substituted -= modes.blend_recomputed(mode, substituted)
    compiled = link.own_reuse = compiled_reuse(link, canonical_from, page_size)
    cached = link.real_slots(0, prefix) + substituted - compiled
    recomputed = link.real_slots(prefix, link.size) - substituted
    link.report = Report(recomputed_tokens=recomputed, compiled_tokens=compiled, chunk_hits=plan_hits,
                         chunk_misses=len(link.keys) - plan_hits, residency=list(link.found or ()),
                         cached_tokens=cached)
    counters.recomputed_tokens += recomputed
    planned = cast("Planned", link.planned)  # admitted: planned
    counters.reused_tokens += link.real_slots(0, prefix) if planned.plan is not None else substituted


class CacheReport:
    """The cache's totals, sampled after allocations and when idle (peak pages in use, /metrics).

    Built by MepicRadixCache with what it reads: the pool's pages, their holders and the ledger's
    freeable count, the chunk store, the compile rows' count and the tiers' figures."""

    def __init__(self, *, pages: PoolPages, refs: PageRefs, ledger: Ledger, store: ChunkStore,
                 compile_rows: CompileRows, tiers: Tiers, mode: modes.Mode, page_size: int,
                 reuse_refused: str | None = None) -> None:
        self.pages, self.refs, self.ledger, self.store = pages, refs, ledger, store
        self.compile_rows, self.tiers, self.mode, self.page_size = compile_rows, tiers, mode, page_size
        self.reuse_refused = reuse_refused  # the mode --mepic-verify refused (then mode is full)
        self.counters = Counters()
        self.peak_pages_in_use = 0
        # the counts `sample` compares, at the last publish: (the pool's free and freeable pages, the others)
        self._sampled: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # None: publish at the next sample
        self._published = 0.0  # clock() at the last publish

    def total_pages(self) -> int:
        return self.pages.allocator.size // self.page_size

    def pages_in_use(self) -> int:
        """Pages running requests hold: allocated pages that evicting every unlocked tree node
        and every unheld chunk would not free (SGLang's "used" = total - available - evictable)."""
        return self._in_use(self.pages.available(), self.ledger.freeable())

    def _in_use(self, available: int, freeable: int) -> int:
        return self.total_pages() - available - freeable

    def publish_at_next_sample(self) -> None:
        """The next `sample` publishes what it finds, as if the counts had moved long enough ago (`reset`, and
        the benches and tests that time a publishing step)."""
        self._sampled = None

    def sample(self, *, busy: bool = True) -> None:
        """The peak follows every sample; /metrics is published when the counts below (all O(1)) moved since
        the last publish. While requests run (`busy`), a move of the pool's free and freeable pages alone is
        published at most every `PUBLISH_EVERY_S`; any other count, at once.

        Most decode steps allocate nothing, and an idle poll changes nothing. But at a decode batch of 64
        a new page is allocated at nearly every step, and setting the gauges (SGLang's multiprocess
        Prometheus files) cost the step about 0.1 ms of the scheduler's time (issue 88's py-spy profile),
        for a figure scraped every few seconds. The other counts move once a request or a chunk, and a
        client may read them right after its response. The idle pass (`busy=False`) publishes what moved at
        once, so /metrics agrees with /server_info once the requests are done."""
        store, available, freeable = self.store, self.pages.available(), self.ledger.freeable()
        self.peak_pages_in_use = max(self.peak_pages_in_use, self._in_use(available, freeable))
        events = (len(store), store.canonical_pages(), self.refs.shared(), store.stats.hits, store.stats.misses,
                  store.stats.evictions, self.counters.compiled_chunks, self.counters.requests_received,
                  self.compile_rows.made)
        counts, last = ((available, freeable), events), self._sampled
        if counts == last:
            return
        now = clock()
        if busy and last is not None and last[1] == events and now - self._published < PUBLISH_EVERY_S:
            return
        self._sampled, self._published = counts, now
        metrics.publish(self.stats())

    def stats(self) -> dict[str, Any]:
        store, counters = self.store, self.counters
        in_use = self.pages_in_use()
        self.peak_pages_in_use = max(self.peak_pages_in_use, in_use)
        return {
            "mode": self.mode.name,
            "reuse_refused": self.reuse_refused,
            "page_size": self.page_size,
            "kv_pages_total": self.total_pages(),
            "kv_pages_free": self.pages.available(),
            "kv_pages_in_use": in_use,
            "kv_pages_in_use_peak": self.peak_pages_in_use,
            "canonical_chunk_pages": store.canonical_pages(),
            "chunks_resident": len(store),
            "shared_pages": self.refs.shared(),
            "chunk_hits": store.stats.hits,
            "chunk_misses": store.stats.misses,
            "chunk_evictions": store.stats.evictions,
            "chunks_compiled": counters.compiled_chunks,
            "compiled_tokens": counters.compiled_tokens,
            "compile_rows": self.compile_rows.made,
            "requests_received": counters.requests_received,
            "recomputed_tokens": counters.recomputed_tokens,
            "reused_tokens": counters.reused_tokens,
            "private_copy_fallbacks": counters.private_copy_fallbacks,
            **self.tiers.stats(),
        }

    def reset(self) -> None:
        """The pool is being cleared: say so without waiting for the next sample."""
        self.peak_pages_in_use = 0
        self.publish_at_next_sample()
        metrics.publish({"kv_pages_in_use": 0, "kv_pages_in_use_peak": 0, "canonical_chunk_pages": 0,
                         "shared_pages": 0, "chunks_resident": 0, "kv_pages_free": self.total_pages()})
