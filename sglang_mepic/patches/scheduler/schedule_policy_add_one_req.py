"""A request joins the prefill batch right behind the compile rows it reads (`batch_join.add_request`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import batch_join

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], adder: PrefillAdder, req: Req, *args: Any, **kwargs: Any) -> AddReqResult:
    return batch_join.add_request(original, adder, req, *args, **kwargs)
