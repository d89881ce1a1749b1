"""At each decode step the chunk cache's figures are sampled after the step's KV allocation
(peak pages, /metrics)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import mepic_cache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
HOOK_TYPE = HookType.AFTER


def hook(result, batch, *args, **kwargs):
    if (tree := mepic_cache(batch)) is not None:
        tree.figures.sample()
    return result
