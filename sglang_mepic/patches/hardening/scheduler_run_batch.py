"""A batch whose forward raises ends its requests with an error instead of the scheduler
process (`batch_guard.run`; what stays fatal is listed there)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening import batch_guard

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler.Scheduler.run_batch"
HOOK_TYPE = HookType.AROUND


def hook(original, scheduler, batch, *args, **kwargs):
    return batch_guard.run(original, scheduler, batch, *args, **kwargs)
