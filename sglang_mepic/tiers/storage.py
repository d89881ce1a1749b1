"""The shared chunk tier: chunk KV by key in one of SGLang HiCache's storage backends.

This module is the tier's client (`Storage`: keys, timeouts, the write queue, outages,
what is logged); an entry's bytes are envelope.py's, the backends' adapters backends.py's.

Every compiled chunk is written here, so other server instances, or this one
after a restart, reuse chunks they never computed. Chunk keys hash the padded
tokens, the model fingerprint and the namespace, never a position, so one entry
serves every instance of the model wherever the chunk appears.

Backends (`--mepic-storage-backend`), made by SGLang's `StorageBackendFactory`
from a `HiCacheStorageConfig` whose `extra_config` is `--mepic-storage-config`
(the JSON of `--hicache-storage-backend-extra-config`):
- `file`: `HiCacheFile`, one file per key written atomically by rename, in
  `--mepic-storage-dir` (its LRU size limit comes from the same JSON);
- `mooncake`: `MooncakeStore`, set up by SGLang from the JSON, or else from
  Mooncake's own `MOONCAKE_*` environment or `SGLANG_HICACHE_MOONCAKE_CONFIG_PATH`.
  Reads and writes use the client it set up, zero-copy from a registered staging
  buffer; its HiCache methods answer only True/False, and a miss must be told
  from an outage;
- any other backend SGLang registers, or `dynamic` (SGLang's way to name a
  HiCacheStorage class of your own: `backend_name`, `module_path`, `class_name`
  in the JSON): through its HiCache `get`/`set`/`exists` on a byte tensor. An
  exception is an outage, None a miss. The launcher refuses a backend whose
  library is missing; one that fails to connect (hf3fs: SGLang makes it only
  around a host KV pool) is logged, and the tier stays a miss. `sim` and `shm`
  keep no bytes and are refused.

Entries are tied to every setting that shapes their bytes. The settings
fingerprint (`settings_fingerprint`) covers the model fingerprint, the mode, the
recompute depth (`config.canonical_from`), the compile sink, the pad placement,
the page size, the KV cache dtype (logical and stored: fp8 e4m3 and e5m2 have one
width) and the TP rank and size. An entry's storage key hashes the chunk key with
that fingerprint (and, with a secret, the secret's id), so instances with other
settings on one directory or store use other keys: their entries coexist.

An entry is an envelope of ours: magic, settings fingerprint, SHA-256 and length
of the payload, and an HMAC-SHA256 of header and payload under
`--mepic-storage-secret` (zeros without one), then the KV. An entry that fails
any check is a miss, logged once per key and never deleted; one that names our
own settings (damaged, or forged without the secret) is replaced by this
instance's next compile of the chunk. Trust: without a secret, anyone who can
write the directory or store can make this server use KV of their choosing; with
one, only holders of the secret can write entries it loads (they can still
delete entries or fill the store, which costs compiles, never correctness).

A backend that is down or slow is a miss too, never a stalled server: writes go
through one background thread (a bounded queue; what does not fit is dropped),
a read waits at most `--mepic-storage-timeout` seconds, and after a failure the
backend is left alone for RETRY_S before it is asked again. Each change between
answering and not is one log line. `get` waits for its read on the caller's
thread; prefetch.py reads on workers (`read_outcome`, which only reads and
checks) and accounts on the scheduler's thread (`settle`, which owns the
figures and the backend's state), so both paths count and log alike.
"""

import hashlib
import json
import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable
from concurrent.futures import TimeoutError as ReadTimeout

import torch

from sglang_mepic import env, modes
from sglang_mepic.tiers.backends import EntryIO, Unavailable, connect
from sglang_mepic.tiers.envelope import (CorruptEntry, ForeignEntry, envelope, envelope_bytes, open_envelope, secret_id,
                                         settings_fingerprint)

logger = logging.getLogger(__name__)

RETRY_S = 2.0      # how long a backend that failed is left alone
MAX_QUEUED = 64    # writes waiting for the backend; more are dropped (the chunk is compiled again later)
MAX_LOGGED = 4096  # rejected keys remembered so each is logged once


class Storage:
    """A HiCache storage backend as the chunk tier, where failing or slow means a miss."""

    def __init__(self, backend: str, extra_config: dict, fingerprint: str, timeout: float = 0.5,
                 io: EntryIO | None = None, secret: bytes | None = None, settings: dict | None = None):
        """`fingerprint` names what the entries' bytes depend on; with `settings` (the SETTINGS
        known so far) it is their settings_fingerprint once `bind` has given the rest."""
        self.backend = backend
        self.fingerprint = fingerprint
        self.settings = dict(settings) if settings is not None else None
        self.secret = secret
        self._key_salt = f"{fingerprint}\0{secret_id(secret)}\0"
        self._replace: set[str] = set()  # storage keys whose entry was rejected: our next write replaces it
        self._logged: set = set()        # (storage key, why) of each rejection logged
        self.timeout = timeout
        self._extra_config = extra_config
        # This rank's place in its TP group, as SGLang's backend is told it (its own key suffix, its device).
        self._tp = (int((settings or {}).get("tp_rank", 0)), int((settings or {}).get("tp_size", 1)))
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="mepic-storage-read")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="mepic-storage-write")
        self._lock = threading.Lock()
        self._reading: Future | None = None  # the last read's future: one read at a time, even one that timed out
        self._queued = 0
        self._down_until = 0.0
        self._down: str | None = None  # why it stopped answering; None while it answers
        self.rejected = self.outages = self.unavailable = self.written = self.dropped = 0
        self._io = io
        # Set whenever _io starts as None (the only way _io is None).
        self._connecting: Future[None] | None = None if io is not None else self._writer.submit(self._connect)

    # ---- the backend's state -------------------------------------------------

    def _connect(self) -> None:
        started = time.perf_counter()
        try:
            self._io = connect(self.backend, self._extra_config, *self._tp)
        except Exception as e:
            self._failed(f"cannot connect ({type(e).__name__}: {e})")
            return
        logger.info("MEPIC storage (%s): connected in %.1f s", self.backend, time.perf_counter() - started)
        self._answered()

    def _ready(self) -> bool:
        if self._io is None:
            if self._connecting is not None and self._connecting.done() and time.monotonic() >= self._down_until:
                self._connecting = self._writer.submit(self._connect)
            return False
        return time.monotonic() >= self._down_until

    def _connected(self) -> EntryIO:
        """The backend; readers and writers run only once it is (readable(), _ready())."""
        if self._io is None:
            raise Unavailable("not connected")
        return self._io

    def _failed(self, reason: str) -> None:
        with self._lock:
            self._down_until = time.monotonic() + RETRY_S
            if self._down is None:
                self._down = reason
                self.outages += 1
                logger.warning("MEPIC storage (%s) unavailable: %s; chunks are computed until it answers "
                               "(asked again every %.0f s)", self.backend, reason, RETRY_S)

    def _answered(self) -> None:
        if self._down is not None:
            with self._lock:
                if self._down is not None:
                    self._down = None
                    logger.warning("MEPIC storage (%s) answers again", self.backend)

    def connected(self, timeout: float = 60.0) -> bool:
        """Wait for the first connection attempt; True when it succeeded."""
        if self._connecting is not None:
            try:
                self._connecting.result(timeout)
            except ReadTimeout:
                return False
        return self._io is not None

    @property
    def tp_rank(self) -> int:
        """This process's TP rank, whose heads its entries hold."""
        return self._tp[0]

    def state(self) -> str:
        if self._io is None:
            return "connecting" if self._down is None else "down"
        return "down" if self._down is not None else "up"

    # ---- entries --------------------------------------------------------------

    def bind(self, **settings) -> None:
        """The settings known once the KV pool exists (page size, KV dtype): they join the fingerprint."""
        if self.settings is None:
            self.settings = {"model": self.fingerprint}
            base = self.fingerprint
            self.fingerprint = hashlib.sha256(
                json.dumps({"base": base, **{k: str(v) for k, v in settings.items()}}, sort_keys=True).encode()
            ).hexdigest()[:32]
            self.settings.update(settings)
        else:
            self.settings.update(settings)
            self.fingerprint = settings_fingerprint(**self.settings)
        self._key_salt = f"{self.fingerprint}\0{secret_id(self.secret)}\0"

    def storage_key(self, key: str) -> str:
        """Where the chunk `key` is stored: the chunk key with the settings (and the secret's id)."""
        return hashlib.sha256((self._key_salt + key).encode()).hexdigest()[:32]  # 32 hex digits, as chunk keys

    def get(self, key: str, like: torch.Tensor) -> torch.Tensor | None:
        """The KV stored for chunk `key`, shaped as `like`; None if absent, unsound, or the backend did not answer.

        Blocks the caller up to the timeout; prefetch.py reads in the background instead."""
        if not self.readable():
            return None
        if self._reading is not None and not self._reading.done():  # one read at a time, even one that timed out
            self.unavailable += 1
            return None
        key = self.storage_key(key)
        self._reading = self._reader.submit(self.read_outcome, key, like)
        try:
            outcome = self._reading.result(timeout=self.timeout)
        except ReadTimeout as e:
            outcome = e
        return self.settle(key, outcome)

    def readable(self) -> bool:
        """Whether a read may start now; when not (connecting, or left alone after a failure),
        the lookup is counted as a miss of an unavailable backend."""
        if self._ready():
            return True
        self.unavailable += 1
        return False

    def read_outcome(self, storage_key: str, like: torch.Tensor) -> torch.Tensor | Exception | None:
        """Read and check the entry at `storage_key` (blocking; on a worker thread, never the
        scheduler's): its KV shaped as `like` (a meta tensor will do), None when absent, or the
        CorruptEntry or Unavailable met. Changes nothing: `settle` accounts for the outcome."""
        try:
            data = self._connected().read(storage_key, envelope_bytes(like))
            return None if data is None else open_envelope(data, self.fingerprint, like, self.secret)
        except (CorruptEntry, Unavailable) as e:
            return e
        except Exception as e:  # whatever a backend raises is an outage, never the scheduler's problem
            return Unavailable(f"read: {type(e).__name__}: {e}")

    def settle(self, storage_key: str, outcome: torch.Tensor | Exception | None) -> torch.Tensor | None:
        """Account for a read's outcome on the thread that owns the counters (the scheduler's):
        the backend's state, the figures and the log. The KV, or None for a miss."""
        if isinstance(outcome, (ReadTimeout, Unavailable)):
            self.unavailable += 1
            self._failed(f"no answer within {self.timeout:g} s" if isinstance(outcome, ReadTimeout) else str(outcome))
            return None
        self._answered()
        if isinstance(outcome, CorruptEntry):
            self._rejected(storage_key, outcome)
            return None
        return outcome

    def _rejected(self, key: str, e: CorruptEntry) -> None:
        self.rejected += 1
        if (key, str(e)) not in self._logged and len(self._logged) < MAX_LOGGED:
            self._logged.add((key, str(e)))
            logger.warning("MEPIC storage (%s): entry %s rejected, treated as a miss: %s (the entry is kept; "
                           "logged once)", self.backend, key, e)
        if not isinstance(e, ForeignEntry) and len(self._replace) < MAX_LOGGED:
            with self._lock:  # it claims our settings: our next compile of the chunk replaces it
                self._replace.add(key)

    def put(self, key: str, kv: torch.Tensor) -> bool:
        """Queue `kv` ([2, layers, tokens, heads, dim]) to be written under `key` unless it is there."""
        with self._lock:
            if not self._ready() or self._queued >= MAX_QUEUED:
                self.dropped += 1
                return False
        self._background(self._write, self.storage_key(key), kv.cpu())  # checksums off the scheduler's thread
        return True

    def _write(self, key: str, kv: torch.Tensor) -> None:
        with self._lock:
            replace = key in self._replace
            self._replace.discard(key)
        io = self._connected()
        if replace:
            io.remove(key)
        elif io.exists(key):
            return
        io.write(key, envelope(kv, self.fingerprint, self.secret))
        self.written += 1

    def _background(self, work: Callable[..., None], *args: Any) -> None:
        with self._lock:
            self._queued += 1

        def run():
            try:
                work(*args)
                self._answered()
            except Unavailable as e:
                self._failed(str(e))
            finally:
                with self._lock:
                    self._queued -= 1
        self._writer.submit(run)

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait for queued writes (tests, shutdown); True when none is left."""
        deadline = time.monotonic() + timeout
        while self._queued and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queued

    def stats(self) -> dict:
        return {"storage_backend": self.backend, "storage_state": self.state(), "storage_rejected": self.rejected,
                "storage_outages": self.outages, "storage_unavailable_misses": self.unavailable,
                "storage_written": self.written, "storage_dropped_writes": self.dropped}

    def close(self) -> None:
        self._reader.shutdown(wait=False, cancel_futures=True)
        self._writer.shutdown(wait=False, cancel_futures=True)


def _tp() -> tuple[int, int]:
    """This process's TP rank and size, from the TP group SGLang built (SGLang 0.5.23 keeps it in
    `sglang.srt.distributed.parallel_state`; its package no longer exports the rank's getter). (0, 1) only
    where no group is built: a process that is no TP rank (tests, tools). Anything else raises: a rank read
    wrongly would key rank 1's heads as rank 0's."""
    import sglang.srt.distributed.parallel_state as parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    group = parallel_state.get_tp_group()
    return int(group.rank_in_group), int(group.world_size)


def settings_known(model_fingerprint: str, settings: env.Settings) -> dict:
    """The SETTINGS the --mepic-* flags and the process give; the KV pool gives the rest (`Storage.bind`)."""
    tp_rank, tp_size = _tp()
    return {"model": model_fingerprint, "mode": settings.mode.name,
            "canonical_from": modes.canonical_from(settings.mode, settings.recompute_blocks),
            "compile_sink": settings.compile_sink, "placement": settings.placement.value,
            "tp_rank": tp_rank, "tp_size": tp_size}


def from_settings(fingerprint: str, settings: env.Settings) -> Storage | None:
    """The shared tier that the --mepic-storage-* settings ask for; None when they ask for none.

    `fingerprint` is the model's; the entries are keyed by every setting (Tiers binds the page
    size and KV dtype)."""
    backend = settings.storage_backend
    if backend is None:
        return None
    extra = settings.storage_config
    if backend == "file":
        extra = {"file_storage_path": settings.storage_dir, **extra}
    known = settings_known(fingerprint, settings)
    partial = settings_fingerprint(**{"page_size": None, "kv_dtype": None, **known})
    return Storage(backend, extra, partial, settings.storage_timeout, secret=settings.storage_secret,
                   settings=known)
