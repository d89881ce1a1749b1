"""`--log-requests` (every level) leaves out each request's kv_hints, where the server's
layout hint and its seal travel (intake.py): a log reader learns no layout and no mark."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sglang.srt.plugins.hook_registry import HookType

if TYPE_CHECKING:
    from sglang.srt.utils.request_logger import RequestLogger

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.utils.request_logger.RequestLogger._compute_metadata"
HOOK_TYPE = HookType.AFTER

UNLOGGED = "kv_hints"


def hook(result: tuple[int | None, set[str] | None, set[str] | None], logger: RequestLogger, *args: Any,
         **kwargs: Any) -> tuple[int | None, set[str], set[str] | None]:
    max_length, skip_names, out_skip_names = result
    return max_length, {*(skip_names or ()), UNLOGGED}, out_skip_names
