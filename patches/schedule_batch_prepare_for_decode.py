"""At each decode step the chunk cache's figures are sampled after the step's KV allocation
(peak pages, /metrics)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import MepicRadixCache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_decode"
HOOK_TYPE = HookType.AFTER


def hook(result, batch, *args, **kwargs):
    tree = batch.tree_cache
    if isinstance(tree, MepicRadixCache):
        tree.figures.sample()
    return result
