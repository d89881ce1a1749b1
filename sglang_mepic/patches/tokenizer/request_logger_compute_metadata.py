"""`--log-requests` (every level) leaves out each request's kv_hints, where the server's
layout hint and its seal travel (intake.py): a log reader learns no layout and no mark."""

from sglang.srt.plugins.hook_registry import HookType

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.utils.request_logger.RequestLogger._compute_metadata"
HOOK_TYPE = HookType.AFTER

UNLOGGED = "kv_hints"


def hook(result, logger, *args, **kwargs):
    max_length, skip_names, out_skip_names = result
    return max_length, {*(skip_names or ()), UNLOGGED}, out_skip_names
