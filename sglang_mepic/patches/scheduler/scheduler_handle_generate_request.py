"""Count the generate requests the scheduler receives (`sglang_mepic:requests_received` on /metrics):
with compile rows made in the scheduler (compile_rows.py) it equals the requests clients sent."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache.radix_cache import mepic_cache

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.handle_generate_request"
HOOK_TYPE = HookType.AROUND


def hook(original, scheduler, *args, **kwargs):
    if (tree := mepic_cache(scheduler)) is not None:
        tree.figures.counters.requests_received += 1
    return original(scheduler, *args, **kwargs)
