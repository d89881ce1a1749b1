"""A request joins the prefill batch right behind the compile rows it reads (`batch_join.add_request`)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import batch_join

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
HOOK_TYPE = HookType.AROUND


def hook(original, adder, req, *args, **kwargs):
    return batch_join.add_request(original, adder, req, *args, **kwargs)
