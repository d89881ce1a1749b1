"""Profiles that cannot brick the server: refused before they start, abandoned when a step fails.

SGLang 0.5.23 checks nothing of a `/start_profile` body. A directory it cannot write (`/proc/no/such/dir`)
was accepted with a 200, and the step that stopped the profile raised in `run_batch` when it made the
directory: the batch guard ended that batch's requests, the profile stayed in progress with its stop step
behind it, so every later batch raised the same way and every request was a 500 while `/health` said 200.
Activities SGLang does not know (`["NOPE"]`) started a profile that records nothing.

So `check_start` refuses, in the tokenizer process and before the scheduler sees the request, a directory
that cannot be made and written, activities outside what this machine records, and step counts below 0
(a 400 that says why); and `abandon` ends a profile whose step raised, in the scheduler, so that the batch
runs on unprofiled and no later batch meets the same fault."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"  # SGLang's default directory, else /tmp (profiler_manager.py)


class ProfileRefused(ValueError):
    """A 400 (hardening/body_types.py answers a ValueError that escapes a route with its status_code)."""

    status_code = 400


def activities_here() -> tuple[str, ...]:
    """What SGLang's torch profiler records on this machine: CPU always, GPU (torch records none where no
    device is, and says so), and the CUDA-only memory and cudaProfiler captures only with CUDA."""
    import torch

    cuda = ("MEM", "CUDA_PROFILER") if torch.cuda.is_available() else ()
    rocm = ("RPD",) if getattr(torch.version, "hip", None) else ()
    return ("CPU", "GPU", *cuda, *rocm)


def _writable_dir(folder: Path) -> None:
    """Make the folder as SGLang's stop step will, and write a file in it: as root every permission check
    passes, so only trying tells (/proc takes no new folder)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise ProfileRefused(f"output_dir {str(folder)!r}: traces cannot be written there "
                             f"({e.strerror or type(e).__name__})") from None


def check_start(request: Any) -> None:
    """Refuse a start the profiler would accept and then fail on (a ProfileReq of START_PROFILE)."""
    activities = request.activities
    if activities is not None:
        known = activities_here()
        if not isinstance(activities, list) or not activities:
            raise ProfileRefused(f"activities: a non-empty list of {', '.join(known)}")
        unknown = [a for a in activities if a not in known]
        if unknown:
            raise ProfileRefused(f"activities {unknown}: this server records {', '.join(known)}")
    for field in ("num_steps", "start_step"):
        value = getattr(request, field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ProfileRefused(f"{field} {value!r}: a whole number of forward steps, at least 0")
    output_dir = request.output_dir if request.output_dir is not None else os.getenv(DEFAULT_DIR_ENV, "/tmp")
    if not isinstance(output_dir, str) or not output_dir.strip():
        raise ProfileRefused("output_dir: a folder path")
    _writable_dir(Path(output_dir).expanduser())


def abandon(manager: Any, error: BaseException) -> None:
    """End the profile whose step raised (a SchedulerProfilerManager): no trace, no stop step left behind."""
    logger.error("MEPIC: a profile step failed (%s: %s); the profile is abandoned and the server goes on",
                 type(error).__name__, error)
    profiler, manager.torch_profiler = getattr(manager, "torch_profiler", None), None
    if profiler is not None:
        try:
            profiler.stop()  # the trace is dropped: it was to be written where writing failed
        except Exception:  # noqa: BLE001 - already stopped, or never started
            pass
    manager.profile_in_progress = False
    manager.profile_by_stage = False
    manager.profiler_start_forward_ct = manager.profiler_target_forward_ct = None
    manager.profiler_target_prefill_ct = manager.profiler_target_decode_ct = None
