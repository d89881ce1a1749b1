"""Admit laid-out requests before a batch allocates, and write their positions after
(`extend.prepare_extend`)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import extend

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_batch.ScheduleBatch.prepare_for_extend"
HOOK_TYPE = HookType.AROUND


def hook(original, batch, *args, **kwargs):
    return extend.prepare_extend(original, batch, *args, **kwargs)
