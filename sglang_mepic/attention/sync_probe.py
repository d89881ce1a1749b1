"""Device-to-host syncs in the attention side's per-batch calls, watched on a GPU (issue 69).

`MEPIC_SYNC_DEBUG=warn` (or `error`) in a server's environment: the mepic backend runs each of its
per-batch calls (init_forward_metadata, the decode and prefill CUDA-graph hooks, the runner's check) and
its position map's writers (assign, release) under `torch.cuda.set_sync_debug_mode`. In "warn" mode a
synchronising operation a call makes, in the thread that runs it, is logged once per place,

    mepic sync debug: init_forward_metadata synchronised (3 so far): <torch's message> at file.py:123 < ...

and counted; every SUMMARY_EVERY calls a line says how many were watched and how many synchronised.
"error" raises at the operation instead. Syncs of other threads in the same moments are let through as
ordinary warnings (the mode is process-wide; the thread tells them apart). The GPU end-to-end run
(eval/gpu/e2e) serves mepic with "warn" and judges the log; tests/attention/test_host_syncs.py runs the same calls
on the meta device, where any read of a device value raises.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import threading
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TextIO, TypeVar

import torch

if TYPE_CHECKING:
    from sglang_mepic.pages.positions import PositionMap

T = TypeVar("T")


class Watchable(Protocol):
    """What `install` reads of the backend it watches (MepicAttnBackend, which imports this module: naming the
    class here would make the two import each other)."""

    use_triton: bool
    positions: PositionMap

logger = logging.getLogger(__name__)

LOG_PREFIX = "mepic sync debug:"
SUMMARY_EVERY = 2000


def _place(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frames of this package (or, if none, the caller's), innermost first."""
    stack = [f for f in stack if os.path.basename(f.filename) not in ("sync_probe.py", "contextlib.py")]
    ours = [f for f in stack if "sglang_mepic" in f.filename or "/kernels/" in f.filename]
    frames = (ours or stack)[-3:]
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(frames))


class SyncProbe:
    def __init__(self, mode: str, get_mode: Callable[[], int] | None = None,
                 set_mode: Callable[[int | str], None] | None = None) -> None:
        self.mode = mode
        # torch.cuda's own (a CPU build has none; the tests hand in stand-ins)
        self._get_mode = get_mode or torch.cuda.get_sync_debug_mode
        self._set_mode = set_mode or torch.cuda.set_sync_debug_mode
        self.calls = 0
        self.syncs: collections.Counter = collections.Counter()  # call name -> synchronising operations
        self._places: set = set()
        self._local = threading.local()

    def wrap(self, name: str, fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def watched(*args: Any, **kwargs: Any) -> T:
            with self.watch(name):
                return fn(*args, **kwargs)
        return watched

    @contextmanager
    def watch(self, name: str) -> Iterator[None]:
        if getattr(self._local, "name", None) is not None:  # a watched call inside another (the replay hook's init)
            yield
            return
        self._local.name = name
        me = threading.get_ident()
        previous = self._get_mode()
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            shown = warnings.showwarning

            def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                     file: TextIO | None = None, line: str | None = None) -> None:
                if threading.get_ident() != me or "synchroniz" not in str(message):
                    return shown(message, category, filename, lineno, file, line)
                self._found(name, str(message), traceback.extract_stack()[:-1])

            warnings.showwarning = show
            self._set_mode(self.mode)
            try:
                yield
            finally:
                self._set_mode(previous)
                self._local.name = None
        self.calls += 1
        if self.calls % SUMMARY_EVERY == 0:
            logger.warning("%s %d calls watched, %d synchronised (%s)", LOG_PREFIX, self.calls,
                           sum(self.syncs.values()), dict(self.syncs) or "none")

    def _found(self, name: str, message: str, stack: list[traceback.FrameSummary]) -> None:
        self.syncs[name] += 1
        place = _place(stack)
        if (name, place) not in self._places:
            self._places.add((name, place))
            logger.warning("%s %s synchronised (%d so far): %s at %s", LOG_PREFIX, name, self.syncs[name],
                           message.strip().splitlines()[0], place)


def install(backend: Watchable, mode: str | None) -> SyncProbe | None:
    """Watch the backend's per-batch calls if MEPIC_SYNC_DEBUG asks (`mode`, from the settings: the GPU path
    only, since the torch path reads per-request values on the host by design)."""
    if mode is None or not backend.use_triton or not torch.cuda.is_available():
        return None
    probe = SyncProbe(mode)
    for name in ("init_forward_metadata", "prepare_forward_metadata_for_breakable_cuda_graph_replay",
                 "init_forward_metadata_out_graph", "init_forward_metadata_in_graph", "can_run_prefill_cuda_graph"):
        setattr(backend, name, probe.wrap(name, getattr(backend, name)))
    for name in ("assign", "release"):
        setattr(backend.positions, name, probe.wrap(f"positions.{name}", getattr(backend.positions, name)))
    logger.warning("%s on (%s): watching the backend's per-batch calls and the position map's writers",
                   LOG_PREFIX, mode)
    return probe
