"""A profile request that cannot work, or that the scheduler refuses, is the client's 400, not a 500.

Before the scheduler sees it, a start is checked (hardening/profile_guard.check_start: a directory that
cannot be written, unknown activities, negative steps). SGLang's tokenizer side raises RuntimeError when the
scheduler answers a profile request with `success: false` (`/stop_profile` with no profile running,
`/start_profile` while one runs), and neither route catches it: Starlette answered a bare 500 for a request
the client got wrong. Raised as a ValueError with the scheduler's message, it is a 400
(hardening/body_types.py answers a ValueError that escapes a route).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening.profile_guard import ProfileRefused, check_start

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import ProfileReq, ProfileReqOutput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin._execute_profile"
HOOK_TYPE = HookType.AROUND


async def hook(original: Callable[..., Any], manager: TokenizerManager, request: ProfileReq, *args: Any,
               **kwargs: Any) -> ProfileReqOutput:
    from sglang.srt.managers.io_struct import ProfileReqType

    if request.req_type == ProfileReqType.START_PROFILE:
        check_start(request)
    try:
        return await original(manager, request, *args, **kwargs)
    except RuntimeError as e:  # SGLang's own: `raise RuntimeError(result.message)` for a refused request
        raise ProfileRefused(str(e) or "the profile request was refused") from None
