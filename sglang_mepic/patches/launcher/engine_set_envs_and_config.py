"""On CPU, SGLang's scheduler and detokenizer start by fork, not spawn.

SGLang forces the spawn start method because a CUDA context does not survive a fork. A CPU
server holds none, and spawn costs each child a fresh import of SGLang, torch and transformers
(about 19 s on 2 cores, the two children at once), paid after the launcher has imported the
same modules: a tiny-model server took 42 s to answer /health, and 26 s with fork. The launcher
runs one thread when SGLang starts its children (checked at the fork), so no lock is inherited
held. A GPU server keeps spawn.
"""

from __future__ import annotations

import multiprocessing as mp
from typing import TYPE_CHECKING, Any, Callable

from sglang.srt.plugins.hook_registry import HookType

if TYPE_CHECKING:
    from sglang.srt.server_args import ServerArgs

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.entrypoints.engine._set_envs_and_config"
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], server_args: ServerArgs, *args: Any, **kwargs: Any) -> None:
    result = original(server_args, *args, **kwargs)  # ends with mp.set_start_method("spawn", force=True)
    # why: ServerArgs assembles its fields (device among them) from arg_groups at run time: mypy sees none of them
    if server_args.device == "cpu":  # type: ignore[attr-defined, unused-ignore]
        mp.set_start_method("fork", force=True)
    return result
