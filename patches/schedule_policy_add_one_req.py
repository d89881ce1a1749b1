"""A request joins the prefill batch right behind the compile rows it reads (`scheduling.add_request`)."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import scheduling

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
HOOK_TYPE = HookType.AROUND


def hook(original, adder, req, *args, **kwargs):
    return scheduling.add_request(original, adder, req, *args, **kwargs)
