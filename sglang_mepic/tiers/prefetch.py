"""Storage reads off the scheduler thread, and a memory of what they found.

SGLang's HiCache prefetches a request's pages from storage to host memory in
background threads while the request waits, and the scheduler asks each round
whether the prefetch is done (`check_prefetch_progress`). This is that shape for
chunk entries: the scheduler `want`s a chunk, a worker reads its entry and checks
its envelope (SHA-256, HMAC) into a host tensor, and the scheduler `poll`s it
without blocking. The threads share nothing but futures: the scheduler thread
owns every table here and the storage's counters (`Storage.settle`); a worker
only reads and checksums. The device pool is never touched here.

What a read found is remembered, so a request that waits for room, or is planned
again next round, never reads or hashes an entry again:
- a fetched entry is kept until the scheduler places it in device pages
  (`taken`), or the least recently used ones are dropped to stay under
  `keep_bytes` (a dropped one is read again if wanted again; one larger than
  `keep_bytes` is answered absent, as a chunk that cannot be held is not loaded);
- an entry found absent, rejected (corrupt, foreign, unauthenticated) or not
  answered in time is answered absent for `absent_s` seconds. The bound trades
  a chunk that another instance writes meanwhile (computed here once more, a
  cost, never a wrong answer) against reads: a request waiting under pressure is
  planned every round, milliseconds apart, and asks for the same chunks each
  time. Our own compile of a chunk forgets its absence (`forget`).

A read is bounded by the storage timeout from when a worker starts it, as the
synchronous read is; past it the chunk is absent and the backend is left alone
(storage.py). A read still queued after that long is answered absent too
(counted as late; the backend is not blamed for our queue). At most
`max_in_flight` reads are queued or running: a want beyond is answered pending
and asked again at the next want.
"""

import os
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as ReadTimeout
from typing import Callable

import torch

from sglang_mepic.tiers.storage import Storage

PENDING = "pending"  # a read is queued or running: ask again
ABSENT = "absent"    # no sound entry to load, now or for a while

ABSENT_S = 10.0      # how long an entry found absent (or unsound, or not answered) is answered absent unread
KEEP_BYTES = 1 << 30  # host memory for fetched entries that wait for device pages
MAX_IN_FLIGHT = 16   # reads queued or running
WORKERS = 2          # reads at once: file reads and hashlib's hashing release the GIL
MAX_ABSENT = 1 << 16  # absences remembered; the oldest are forgotten first

# A test's way to make one TP rank's storage reads time out while the others' answer
# (tests/scale_out/e2e/test_tp_tiers_server.py): "<rank>:<file>": while the file exists, that rank's
# reads wait past the storage timeout before they read. Unset, nothing is injected.
SLOW_READS_ENV = "SGLANG_MEPIC_TEST_SLOW_READS"


def _slow_reads_file(storage: Storage) -> str | None:
    """The file that, while it exists, slows this rank's reads (SLOW_READS_ENV); None for no fault."""
    rank, _, path = os.environ.get(SLOW_READS_ENV, "").partition(":")
    return path if path and rank == str(storage.tp_rank) else None


class _Read:
    """One entry being read by a worker."""

    __slots__ = ("storage_key", "future", "queued", "started")
    future: Future  # submitted right after the read is made, before anyone sees it

    def __init__(self, storage_key: str, queued: float):
        self.storage_key = storage_key
        self.queued = queued
        self.started: float | None = None  # set by the worker (one float: no lock needed)


class Prefetch:
    """Background reads of a storage's chunk entries, with their results remembered."""

    def __init__(self, storage: Storage, *, workers: int = WORKERS, keep_bytes: int = KEEP_BYTES,
                 absent_s: float = ABSENT_S, max_in_flight: int = MAX_IN_FLIGHT, clock: Callable[[], float] = time.monotonic):
        self.storage = storage
        self.keep_bytes = keep_bytes
        self.absent_s = absent_s
        self.max_in_flight = max_in_flight
        self._clock = clock
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="mepic-prefetch")
        self._slow_reads = _slow_reads_file(storage)
        self._reads: dict[str, _Read] = {}                              # chunk key -> read in flight
        self._fetched: "OrderedDict[str, torch.Tensor]" = OrderedDict()  # chunk key -> KV, oldest use first
        self._absent: "OrderedDict[str, float]" = OrderedDict()          # chunk key -> answered absent until
        self.kept_bytes = 0
        self.reads = self.remembered = self.deferred = self.dropped = self.late = 0

    # ---- the scheduler's calls -------------------------------------------------

    def want(self, key: str, like: torch.Tensor) -> "torch.Tensor | str":
        """The chunk's KV if fetched, else PENDING or ABSENT; starts a read of its entry unless
        one is in flight or its outcome is remembered. `like` gives the KV's shape and dtype
        (a meta tensor will do)."""
        answer = self.poll(key)
        if answer is not None:
            return answer
        if len(self._reads) >= self.max_in_flight:
            self._collect()
            if len(self._reads) >= self.max_in_flight:
                self.deferred += 1
                return PENDING
        if not self.storage.readable():  # down or connecting: a miss, counted as the storage's
            return ABSENT
        read = _Read(self.storage.storage_key(key), self._clock())
        read.future = self._pool.submit(self._work, read, like.to("meta"))
        self._reads[key] = read
        self.reads += 1
        return PENDING

    def poll(self, key: str) -> "torch.Tensor | str | None":
        """Without blocking: the KV if fetched, PENDING while read, ABSENT when remembered
        absent; None when nothing is known (nothing was wanted, or it was forgotten)."""
        read = self._reads.get(key)
        if read is not None:
            return self._settle(key, read)
        kv = self._fetched.get(key)
        if kv is not None:
            self._fetched.move_to_end(key)
            self.remembered += 1
            return kv
        until = self._absent.get(key)
        if until is not None:
            if self._clock() < until:
                self.remembered += 1
                return ABSENT
            del self._absent[key]
        return None

    def fetched(self, key: str) -> torch.Tensor | None:
        """The chunk's fetched KV, if it is kept (no read, no figure counted)."""
        return self._fetched.get(key)

    def taken(self, key: str) -> None:
        """The chunk is in device pages now: its host copy is not needed any more."""
        kv = self._fetched.pop(key, None)
        if kv is not None:
            self.kept_bytes -= _nbytes(kv)

    def forget(self, key: str) -> None:
        """The chunk was just written to storage: a remembered absence is stale."""
        self._absent.pop(key, None)

    def clear(self) -> None:
        """Forget what was fetched or found absent (reads in flight go on)."""
        self._fetched.clear()
        self._absent.clear()
        self.kept_bytes = 0

    def stats(self) -> dict:
        return {"prefetch_reads": self.reads, "prefetch_remembered": self.remembered,
                "prefetch_in_flight": len(self._reads), "prefetch_deferred": self.deferred,
                "prefetch_late": self.late, "prefetch_kept_chunks": len(self._fetched),
                "prefetch_kept_bytes": self.kept_bytes, "prefetch_dropped": self.dropped}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- the worker --------------------------------------------------------------

    def _work(self, read: _Read, like: torch.Tensor):
        read.started = self._clock()
        if self._slow_reads is not None and os.path.exists(self._slow_reads):  # a test's fault (SLOW_READS_ENV)
            time.sleep(self.storage.timeout + 0.5)
        return self.storage.read_outcome(read.storage_key, like)

    # ---- outcomes, on the scheduler's thread -----------------------------------

    def _settle(self, key: str, read: _Read) -> "torch.Tensor | str":
        future = read.future
        if not future.done():
            now = self._clock()
            if read.started is not None:
                if now - read.started <= self.storage.timeout:
                    return PENDING
                outcome = ReadTimeout()  # the late answer, if any, is dropped with the future
            elif now - read.queued <= self.storage.timeout or not future.cancel():
                return PENDING
            else:  # still queued behind other reads: absent, but no fault of the backend's
                del self._reads[key]
                self.late += 1
                return self._absent_now(key)
        elif future.cancelled():  # by close()
            del self._reads[key]
            return ABSENT
        else:
            outcome = future.result()
        del self._reads[key]
        kv = self.storage.settle(read.storage_key, outcome)
        if kv is None or not self._keep(key, kv):
            return self._absent_now(key)
        return kv

    def _collect(self) -> None:
        """Settle the reads that are done or overdue (a request that wanted them may be gone)."""
        for key, read in list(self._reads.items()):
            self._settle(key, read)

    def _absent_now(self, key: str) -> str:
        self._absent[key] = self._clock() + self.absent_s
        self._absent.move_to_end(key)
        while len(self._absent) > MAX_ABSENT:
            self._absent.popitem(last=False)
        return ABSENT

    def _keep(self, key: str, kv: torch.Tensor) -> bool:
        """Keep a fetched entry until it is taken; False for one larger than the whole memory."""
        size = _nbytes(kv)
        if size > self.keep_bytes:
            self.dropped += 1
            return False
        while self.kept_bytes + size > self.keep_bytes:
            self.kept_bytes -= _nbytes(self._fetched.popitem(last=False)[1])
            self.dropped += 1
        self._fetched[key] = kv
        self.kept_bytes += size
        return True


def _nbytes(kv: torch.Tensor) -> int:
    return kv.numel() * kv.element_size()
