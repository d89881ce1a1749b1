"""A prefill round of the mepic cache: compile rows can be made in it, requests that must wait for
a chunk sit it out, and requests planned but not admitted let go of their chunk pages at its end
(`prefill_round.prefill_round`)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import prefill_round

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
HOOK_TYPE = HookType.AROUND


def hook(original, scheduler, *args, **kwargs):
    return prefill_round.prefill_round(original, scheduler, *args, **kwargs)
