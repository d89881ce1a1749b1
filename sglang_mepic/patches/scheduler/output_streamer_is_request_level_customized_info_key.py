"""The MEPIC report (wire/report.py) is sent once per request, not one value per output token."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.wire.report import KEY

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer

WRITTEN_FOR = "0.5.23"
TARGET = ("sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
          ".is_request_level_customized_info_key")
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], streamer: SchedulerOutputStreamer, key: str, *args: Any, **kwargs: Any) -> bool:
    return key == KEY or original(streamer, key, *args, **kwargs)
