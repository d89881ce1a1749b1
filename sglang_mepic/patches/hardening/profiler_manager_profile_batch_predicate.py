"""A profile step that raises ends the profile, not the batch (hardening/profile_guard.abandon).

SGLang runs this step at the start of every `run_batch`; when it raised (its stop step could not make the
trace directory), the batch guard failed the batch, and the profile, still in progress, raised again in
every later batch."""

from __future__ import annotations

from typing import Any, Callable

from sglang.srt.plugins.hook_registry import HookType

from sglang_mepic.hardening.profile_guard import abandon

WRITTEN_FOR = "0.5.23"
TARGET = ("sglang.srt.managers.scheduler_components.profiler_manager.SchedulerProfilerManager."
          "_profile_batch_predicate")
HOOK_TYPE = HookType.AROUND


def hook(original: Callable[..., Any], manager: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    try:
        return original(manager, batch, *args, **kwargs)
    except Exception as error:  # noqa: BLE001 - whatever the profiler raised, the batch runs on
        abandon(manager, error)
        return None
