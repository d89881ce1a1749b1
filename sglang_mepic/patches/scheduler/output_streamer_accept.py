"""Report a laid-out request's token counts in real tokens, and its MEPIC figures (sglang_mepic.cache.output_report)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.cache import output_report

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.output_streamer import _GenerationStreamAccumulator

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], accumulator: _GenerationStreamAccumulator, *args: Any, req: Req,
         **kwargs: Any) -> None:
    return output_report.accept(original, accumulator, *args, req=req, **kwargs)
