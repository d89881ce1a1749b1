"""MEPIC figures on SGLang's Prometheus endpoint (`/metrics`, with `--enable-metrics`).

The scheduler process sets these after every KV allocation (see
`MepicRadixCache.sample`); SGLang's multiprocess Prometheus collector serves them
from the HTTP process. Without `--enable-metrics` nothing is created.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler

PREFIX = "sglang_mepic:"
DESCRIPTIONS = {
    "kv_pages_in_use": "KV pages held by running requests (not freeable by evicting the tree and the chunk store)",
    "kv_pages_in_use_peak": "Highest kv_pages_in_use since start (or since the last flush)",
    "kv_pages_free": "KV pages free in the pool",
    "canonical_chunk_pages": "KV pages the chunk store keeps as canonical chunk pages",
    "shared_pages": "KV pages with more than one holder (store, tree nodes, requests)",
    "chunks_resident": "Chunks in the chunk store",
    "chunk_hits": "Chunk occurrences found in the store (cumulative)",
    "chunk_misses": "Chunk occurrences not found in the store (cumulative)",
    "chunk_evictions": "Chunks evicted from the store (cumulative)",
    "chunks_compiled": "Compile rows that produced canonical pages (cumulative)",
    "compile_rows": "Chunks the scheduler computed standalone in a reader's prefill batch (cumulative)",
    "requests_received": ("Generate requests the scheduler received (cumulative); equals the requests clients "
                          "sent (sglang:num_requests_total): no internal requests are made"),
    "recomputed_tokens": "Tokens computed in a request's context, prompt and chunk first blocks (cumulative)",
    "reused_tokens": "Tokens whose KV was reused rather than computed (cumulative)",
    "compiled_tokens": "Tokens computed by compile rows (cumulative)",
    "tier_lookups_device": "Chunk occurrences of admitted requests found in the device pool (cumulative)",
    "tier_lookups_host": "Chunk occurrences of admitted requests found in the host tier (cumulative)",
    "tier_lookups_storage": "Chunk occurrences of admitted requests found in the file tier (cumulative)",
    "tier_lookups_absent": "Chunk occurrences of admitted requests found in no tier, so computed (cumulative)",
    "tier_hit_rate_device": "Share of chunk occurrences served by the device pool",
    "tier_hit_rate_host": "Share of chunk occurrences served by the host tier",
    "tier_hit_rate_storage": "Share of chunk occurrences served by the file tier",
    "host_pages_used": "Host-tier pages holding chunk KV",
    "host_chunks": "Chunks in the host tier",
}

REUSE_REFUSED = "reuse_refused"
REUSE_REFUSED_DESCRIPTION = ("1: the accuracy gate (--mepic-verify) refused reuse in the labelled mode for this model "
                             "and the server runs as full; 0: the labelled mode runs")

_gauges: dict[str, Any] | None = None  # name -> prometheus_client Gauge


def _create() -> dict[str, Any]:
    global _gauges
    if _gauges is None:
        if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            _gauges = {}
        else:
            from prometheus_client import Gauge

            _gauges = {name: Gauge(PREFIX + name, doc, multiprocess_mode="mostrecent")
                       for name, doc in DESCRIPTIONS.items()}
    return _gauges


def publish(stats: dict[str, Any]) -> None:
    for name, gauge in _create().items():
        if name in stats:
            gauge.set(stats[name])


def publish_reuse_refused(running_mode: str, refused_mode: str | None) -> None:
    """Set once at start: the gate's refusal, labelled with the refused mode (else the running one)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    from prometheus_client import Gauge

    gauge = Gauge(PREFIX + REUSE_REFUSED, REUSE_REFUSED_DESCRIPTION, labelnames=["mode"],
                  multiprocess_mode="mostrecent")
    gauge.labels(mode=refused_mode or running_mode).set(1 if refused_mode else 0)


def refresh_sglang_usage_when_stale(scheduler: Scheduler) -> None:
    """Make SGLang publish its own usage gauges (`sglang:num_used_tokens`, `sglang:token_usage`) at this
    idle pass when the pool's use changed since they were last published.

    SGLang refreshes them with each batch and, when idle, only every 30 s: after the last requests
    finished, or a flush, a dashboard read a busy pool for up to 30 s while these gauges read it
    empty. The comparison reads two counters; SGLang's own `last_log_time = 0` forces the publication.
    """
    reporter = getattr(scheduler, "metrics_reporter", None)
    if reporter is None or not getattr(reporter, "current_scheduler_metrics_enabled", False):
        return
    used, _ = scheduler.pool_stats_observer.get_pool_stats().get_kv_token_stats()
    if used != reporter.stats.num_used_tokens:
        reporter.metrics_collector.last_log_time = 0.0
