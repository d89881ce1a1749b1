"""A CPU server's scheduler leaves a core to the server's other processes (`launch.defaults.cpu_scheduler_threads`).

Set here, in the scheduler process, before the model loads: torch's thread count cannot be set in the
launcher that forks the scheduler (docs/development.md, the fork server), and OMP_NUM_THREADS, read when
OpenMP loads, would make every forked server start cold.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.launch import defaults

if TYPE_CHECKING:
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)

WRITTEN_FOR = "0.5.23"
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.load_model"
HOOK_TYPE = HookType.BEFORE


def hook(runner: ModelRunner, *args: Any, **kwargs: Any) -> None:
    if runner.device != "cpu":
        return
    cpus = len(os.sched_getaffinity(0))
    threads = defaults.cpu_scheduler_threads(os.environ, cpus, torch.get_num_threads())
    if threads is not None:
        logger.info("CPU scheduler: %d torch thread(s) of %d cores, one left to the tokenizer, detokenizer and "
                    "HTTP server (OMP_NUM_THREADS sets another count)", threads, cpus)
        torch.set_num_threads(threads)
