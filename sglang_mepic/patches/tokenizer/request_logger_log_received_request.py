"""`--log-requests` at level 2 and up decodes a request's input ids into its text for the log: ids the
tokenizer cannot decode (the chunk markers -100/-101 that chat markup and id markup put in them, or
any negative id) raised there, before the request was even tokenized, and the request got a 500.
Those ids are logged as ids, undecoded; the markup is then read and refused or laid out as on
every other level (ids_and_hint.py, intake.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput
    from sglang.srt.utils.request_logger import RequestLogger

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.utils.request_logger.RequestLogger.log_received_request"
HOOK_TYPE = HookType.AROUND

_DECODABLE = 2**31  # what a tokenizer's decode takes without raising, at most


def decodable(input_ids: list[int] | list[list[int]] | None) -> bool:
    rows = input_ids if input_ids and isinstance(input_ids[0], list) else [input_ids or []]
    return all(isinstance(t, int) and 0 <= t < _DECODABLE for row in rows for t in row)


def hook(original: Callable[..., Any], request_logger: RequestLogger, obj: GenerateReqInput | EmbeddingReqInput,
         tokenizer: Any = None, *args: Any, **kwargs: Any) -> None:
    if tokenizer is not None and not decodable(getattr(obj, "input_ids", None)):
        tokenizer = None  # no text from the ids: the log shows the ids themselves
    return original(request_logger, obj, tokenizer, *args, **kwargs)
