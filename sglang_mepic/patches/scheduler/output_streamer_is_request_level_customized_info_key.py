"""The MEPIC report (wire/report.py) is sent once per request, not one value per output token."""

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.wire.report import KEY

WRITTEN_FOR = "0.5.23"
TARGET = ("sglang.srt.managers.scheduler_components.output_streamer.SchedulerOutputStreamer"
          ".is_request_level_customized_info_key")
HOOK_TYPE = HookType.AROUND


def hook(original, streamer, key, *args, **kwargs):
    return key == KEY or original(streamer, key, *args, **kwargs)
