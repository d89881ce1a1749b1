"""The HiCache storage backends the chunk tier reads and writes through, one adapter each.

`connect` makes one with SGLang's `StorageBackendFactory` and wraps it: `FileIO`
(HiCacheFile: one file per key), `MooncakeIO` (zero-copy through the client
SGLang set up, telling a miss from an outage) and `HiCacheIO` (any other
registered backend, or `dynamic`, through its get/set/exists). An adapter's
`read` returns None for a miss and raises Unavailable for an outage and
CorruptEntry for bytes that cannot be an entry.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

from sglang_mepic.tiers.envelope import CorruptEntry

if TYPE_CHECKING:
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage
    from sglang.srt.mem_cache.storage.mooncake_store.mooncake_store import MooncakeStore


class Unavailable(RuntimeError):
    """The backend did not answer."""


class EntryIO(Protocol):
    """What the chunk tier asks of an adapter (storage.py)."""

    def exists(self, key: str) -> bool: ...

    def read(self, key: str, nbytes: int) -> torch.Tensor | None: ...

    def write(self, key: str, data: torch.Tensor) -> None: ...

    def remove(self, key: str) -> None: ...


class FileIO:
    """Entries as files through HiCacheFile."""

    def __init__(self, backend: HiCacheFile):
        self.files = backend

    def path(self, key: str) -> str:
        return os.path.join(self.files.file_path, f"{key}{self.files.config_suffix}.bin")

    def exists(self, key: str) -> bool:
        return self.files.exists(key)

    def read(self, key: str, nbytes: int) -> torch.Tensor | None:
        try:
            size = os.path.getsize(self.path(key))
        except FileNotFoundError:
            return None
        except OSError as e:
            raise Unavailable(e.strerror) from None
        if size != nbytes:
            raise CorruptEntry(f"file of {size} bytes, expected {nbytes}")
        data = torch.empty(nbytes, dtype=torch.uint8)
        try:
            return data if self.files.get(key, data) is not None else None
        except OSError as e:  # a short read: the file changed under us
            raise CorruptEntry(str(e)) from None

    def write(self, key: str, data: torch.Tensor) -> None:
        if not self.files.set(key, data):
            raise Unavailable(f"cannot write {self.path(key)}")

    def remove(self, key: str) -> None:
        try:
            os.remove(self.path(key))
        except OSError:
            pass


class MooncakeIO:
    """Entries as Mooncake objects, through the client SGLang's MooncakeStore set up."""

    EXISTS, ABSENT = 1, 0
    NOT_FOUND = -704    # Mooncake's OBJECT_NOT_FOUND
    TOO_SMALL = -600    # INVALID_PARAMS: the stored object is larger than the buffer given
    ALREADY_THERE = -706

    def __init__(self, backend: MooncakeStore):
        self.client = backend.store
        # (role, thread) -> registered staging buffer: the storage's reader and writer and the
        # prefetch workers (prefetch.py) each use their own, as they read and write at once
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}

    def _staging(self, role: str, nbytes: int) -> torch.Tensor:
        slot = (role, threading.get_ident())
        buf = self._buffers.get(slot)
        if buf is None or buf.numel() < nbytes:
            new = torch.empty(max(nbytes, 2 * (buf.numel() if buf is not None else 0), 1 << 20), dtype=torch.uint8)
            if self.client.register_buffer(new.data_ptr(), new.numel()) != 0:
                raise Unavailable("cannot register a staging buffer")
            if buf is not None:
                self.client.unregister_buffer(buf.data_ptr())
            self._buffers[slot] = buf = new
        return buf

    def exists(self, key: str) -> bool:
        code = self.client.batch_is_exist([key])[0]
        if code < 0:
            raise Unavailable(f"error {code}")
        return code == self.EXISTS

    def read(self, key: str, nbytes: int) -> torch.Tensor | None:
        buf = self._staging("read", nbytes)
        code = self.client.batch_get_into([key], [buf.data_ptr()], [nbytes])[0]
        if code == self.NOT_FOUND:
            return None
        if code == self.TOO_SMALL:
            raise CorruptEntry(f"larger than the {nbytes} bytes expected")
        if code < 0:
            raise Unavailable(f"error {code}")
        if code != nbytes:
            raise CorruptEntry(f"{code} bytes, expected {nbytes}")
        return buf[:nbytes].clone()

    def write(self, key: str, data: torch.Tensor) -> None:
        buf = self._staging("write", data.numel())
        buf[:data.numel()].copy_(data)
        code = self.client.batch_put_from([key], [buf.data_ptr()], [data.numel()])[0]
        if code < 0 and code != self.ALREADY_THERE:
            raise Unavailable(f"error {code}")

    def remove(self, key: str) -> None:
        try:
            self.client.remove(key, force=True)  # under a read lease still: it is garbage either way
        except Exception:  # removal is best effort: the entry is rejected on every read anyway
            pass


class HiCacheIO:
    """Entries through a backend's own HiCache methods, for every backend without a class here."""

    def __init__(self, backend: HiCacheStorage):
        self.backend = backend

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.backend, method)(*args)
        except Exception as e:  # whatever a backend raises is an outage, never the scheduler's problem
            raise Unavailable(f"{method}: {type(e).__name__}: {e}") from None

    def exists(self, key: str) -> bool:
        return bool(self._call("exists", key))

    def read(self, key: str, nbytes: int) -> torch.Tensor | None:
        data = self._call("get", key, torch.empty(nbytes, dtype=torch.uint8))
        if data is None:
            return None
        data = data.reshape(-1).view(torch.uint8)
        if data.numel() != nbytes:
            raise CorruptEntry(f"{data.numel()} bytes, expected {nbytes}")
        return data

    def write(self, key: str, data: torch.Tensor) -> None:
        if not self._call("set", key, data):
            raise Unavailable(f"set: the backend refused {key}")

    def remove(self, key: str) -> None:
        if hasattr(self.backend, "delete"):  # not part of HiCacheStorage: a rejected entry may stay
            try:
                self.backend.delete(key)
            except Exception:
                pass


IO: dict[str, Callable[[Any], EntryIO]] = {"file": FileIO, "mooncake": MooncakeIO}
NO_BYTES = ("sim", "shm")  # SGLang's simulator and shared-memory stand-in: they store no KV


def backends() -> list[str]:
    """The backend names SGLang's factory knows, and `dynamic`."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    return [*StorageBackendFactory._registry, "dynamic"]


def importable(backend: str) -> None:
    """Import a registered backend's class; ImportError says what its library needs."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if backend in StorageBackendFactory._registry:
        StorageBackendFactory._registry[backend]["loader"]()


def connect(backend: str, extra_config: dict, tp_rank: int = 0, tp_size: int = 1) -> EntryIO:
    """One of SGLang's HiCache storage backends, made by its factory, wrapped for chunk entries. tp_rank,
    tp_size: this process's place in its TP group, which the backend keys its entries by (HiCacheFile's
    `_<model>_<tp_rank>_<tp_size>` suffix) as HiCache's own would be."""
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    config = HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=False, model_name="mepic", extra_config=extra_config)
    return IO.get(backend, HiCacheIO)(StorageBackendFactory.create_backend(backend, config, None))
