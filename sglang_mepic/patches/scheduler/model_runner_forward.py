"""A CPU server's scheduler runs each forward with the torch threads `launch.defaults.CpuThreads` gives it:
one core left to the server's other processes, every core for a long extend.

Set here, in the scheduler's forward thread (OpenMP keeps the count per thread): torch's count cannot be
set in the launcher that forks the scheduler (docs/development.md, the fork server), and OMP_NUM_THREADS,
read when OpenMP loads, would make every forked server start cold.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Literal

import torch
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.launch.defaults import CpuThreads
from sglang_mepic.side_table import SideTable

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
HOOK_TYPE = HookType.BEFORE

_THREADS: SideTable[CpuThreads | Literal[False]] = SideTable("CPU threads of a model runner")


def hook(runner: ModelRunner, forward_batch: ForwardBatch, *args: Any, **kwargs: Any) -> None:
    planned = _THREADS.get(runner)
    if planned is None:  # the first forward
        threads = CpuThreads.plan(os.environ, len(os.sched_getaffinity(0)), torch.get_num_threads(),
                                  runner.model_config.hidden_size) if runner.device == "cpu" else None
        _THREADS.set(runner, threads or False)
        if threads is not None:
            logger.info("CPU scheduler: %d torch thread(s) for decodes and short extends, %d for an extend of %d "
                        "tokens or more (OMP_NUM_THREADS sets one count for all)", threads.fewer, threads.every,
                        threads.long_extend_tokens)
    else:
        threads = planned or None
    if threads is not None:
        extend = forward_batch.forward_mode.is_extend()
        count = threads.for_forward(extend, int(forward_batch.extend_num_tokens or 0) if extend else 0)
        if count is not None:
            torch.set_num_threads(count)
