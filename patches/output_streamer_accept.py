"""Report a laid-out request's token counts in real tokens, not KV slots.

`prompt_tokens` and `cached_tokens` come from the request's slot counts; for a
request laid out with pad slots those include pads, which are not tokens the
client sent. The accumulator's newest entry is corrected after it is appended.
"""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.request_layout import pad_runs, pads_before

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
HOOK_TYPE = HookType.AROUND


def hook(original, accumulator, *args, req, **kwargs):
    before = len(accumulator.rids)
    result = original(accumulator, *args, req=req, **kwargs)
    runs = pad_runs(req.kv_hints)
    if runs and len(accumulator.rids) > before:
        accumulator.prompt_tokens[-1] -= sum(count for _, count in runs)
        accumulator.cached_tokens[-1] -= pads_before(runs, accumulator.cached_tokens[-1])
    return result
