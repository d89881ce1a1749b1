"""A control reply that says its request failed only in its `rid` (wire/control.py) is raised as a ValueError.

The scheduler answers a failed control request with the reply its route waits for
(patches/hardening/type_based_dispatcher_call.py). Some reply types have no field for a failure and its
reason (`ResumeMemoryOccupationReqOutput`, `SlowDownReqOutput`, `GetInternalStateReqOutput`, ...),
and their routes would answer 200; raised here, where the route awaits its replies, the failure is
its 400: those routes catch the error and answer it, and a ValueError that escapes a route is a 400
too (hardening/body_types.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.wire import control

if TYPE_CHECKING:
    from sglang.srt.managers.communicator import FanOutCommunicator

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.communicator.FanOutCommunicator.__call__"
HOOK_TYPE = HookType.AROUND


class ControlRequestFailed(ValueError):
    status_code = 400  # what SGLang's `_create_error_response` answers with


async def hook(original: Callable[..., Any], communicator: FanOutCommunicator[Any], obj: Any, *args: Any,
               **kwargs: Any) -> list[Any] | None:
    replies = await original(communicator, obj, *args, **kwargs)
    reasons = [r for r in map(control.failure, replies or ()) if r is not None]
    if reasons:
        raise ControlRequestFailed(" | ".join(dict.fromkeys(reasons)))
    return replies
