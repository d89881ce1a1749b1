"""Input logprobs of a laid-out request come back per user token (`logprobs.add_input_logprobs`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import logprobs

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.logprob_result_processor import (
        SchedulerLogprobResultProcessor,
    )

WRITTEN_FOR = "0.5.23"
TARGET = ("sglang.srt.managers.scheduler_components.logprob_result_processor."
          "SchedulerLogprobResultProcessor.add_input_logprob_return_values")
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], processor: SchedulerLogprobResultProcessor, i: int, req: Req, *args: Any,
         last_prefill_chunk: bool, **kwargs: Any) -> None:
    return logprobs.add_input_logprobs(original, processor, i, req, *args, last_prefill_chunk=last_prefill_chunk,
                                       **kwargs)
