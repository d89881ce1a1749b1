"""A weight update from disk whose `model_path` is no model folder is answered as a failed update (a 400)
before SGLang's loader takes it for a Hub id and leaves a lock file in /tmp (sglang_mepic.hardening.weight_paths)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening import weight_paths

if TYPE_CHECKING:
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager.update_weights_from_disk"
HOOK_TYPE = HookType.AROUND


async def hook(original: Callable[..., Any], manager: TokenizerManager, obj: UpdateWeightFromDiskReqInput,
               *args: Any, **kwargs: Any) -> tuple[bool, str, int]:
    why = weight_paths.path_error(obj.model_path)
    if why is not None:
        return False, why, 0  # (success, message, paused requests): the route answers a failure with a 400
    return await original(manager, obj, *args, **kwargs)
