"""Report a laid-out request's token counts in real tokens, and its MEPIC figures (sglang_mepic.cache.output_counts)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import output_counts

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
HOOK_TYPE = HookType.AROUND


def hook(original, accumulator, *args, req, **kwargs):
    return output_counts.accept(original, accumulator, *args, req=req, **kwargs)
