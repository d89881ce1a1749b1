"""Where a chunk's canonical KV lives below the device pool: host memory, then files.

The device pool holds a chunk's canonical pages while the chunk store keeps it.
When the store evicts a chunk under memory pressure, its KV is copied to the
host tier (`--mepic-host-tier-gb`) instead of being lost; a later lookup copies
it back into fresh device pages, so the chunk costs a copy plus the per-request
first-block recompute instead of a standalone compile. Below that, a file tier
(`--mepic-storage-dir`) keeps every compiled chunk by hash, so other server
instances, or this one after a restart, reuse chunks they never computed.

Chunk keys hash the chunk's tokens with the model fingerprint (segments.span_hash),
never its position, so an entry is valid wherever the chunk appears.

What is SGLang's here:
- the host tier's memory is SGLang's HiCache host pool (`MHATokenToKVPoolHost`,
  layer-first layout): its sizing in GB against the host's free memory, its
  page allocator and its buffer. Its transfer methods are not used: on CPU they
  need sgl_kernel's `transfer_kv_*` ops, which the CPU install does not have, so
  the copies are plain tensor indexing (what the `direct` io backend does);
- the file tier is SGLang HiCache's file storage backend (`HiCacheFile`: atomic
  write by rename, one `.bin` per key). An entry is an envelope of ours
  (`envelope`): magic, model fingerprint, payload length and SHA-256, then the KV.
  A corrupt or mismatched entry is logged, removed and treated as a miss.
"""

import hashlib
import logging
import os
import struct
from collections import Counter, OrderedDict

import torch

logger = logging.getLogger(__name__)

MAGIC = b"MEPICKV1"
_HEADER = struct.Struct("<8s32s32sQ")  # magic, model fingerprint, sha256 of payload, payload bytes


class CorruptEntry(ValueError):
    """A stored entry that must not be loaded."""


def envelope(kv: torch.Tensor, fingerprint: str) -> torch.Tensor:
    payload = kv.contiguous().view(torch.uint8).reshape(-1)
    digest = hashlib.sha256(payload.numpy().tobytes()).digest()
    header = _HEADER.pack(MAGIC, fingerprint.encode()[:32].ljust(32, b"\0"), digest, payload.numel())
    return torch.cat([torch.frombuffer(bytearray(header), dtype=torch.uint8), payload])


def open_envelope(data: torch.Tensor, fingerprint: str, like: torch.Tensor) -> torch.Tensor:
    """The KV in `data`, shaped as `like`; raises CorruptEntry when it must not be loaded."""
    if data.numel() < _HEADER.size:
        raise CorruptEntry("shorter than its header")
    magic, fp, digest, size = _HEADER.unpack(data[:_HEADER.size].numpy().tobytes())
    if magic != MAGIC:
        raise CorruptEntry("not a MEPIC chunk entry")
    written_for = fp.rstrip(b"\0")
    if written_for != fingerprint.encode()[:32]:
        raise CorruptEntry(f"written for another model (fingerprint {written_for.decode(errors='replace')})")
    payload = data[_HEADER.size:]
    if size != payload.numel() or size != like.numel() * like.element_size():
        raise CorruptEntry(f"payload of {size} bytes, expected {like.numel() * like.element_size()}")
    if hashlib.sha256(payload.numpy().tobytes()).digest() != digest:
        raise CorruptEntry("checksum mismatch")
    return payload.view(like.dtype).reshape(like.shape)


class DevicePool:
    """The device KV buffers seen as [2, layers, tokens, heads, dim] at given token slots."""

    def __init__(self, kv_pool):
        self.k = kv_pool.k_buffer
        self.v = kv_pool.v_buffer

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.stack([b[slots] for b in self.k]), torch.stack([b[slots] for b in self.v])])

    def scatter(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            k[slots] = kv[0, layer].to(k.device, k.dtype)
            v[slots] = kv[1, layer].to(v.device, v.dtype)

    def empty(self, num_slots: int) -> torch.Tensor:
        k = self.k[0]
        return torch.empty((2, len(self.k), num_slots, *k.shape[1:]), dtype=k.dtype)


class HostTier:
    """A bounded LRU of chunk KV in SGLang's HiCache host pool."""

    def __init__(self, kv_pool, page_size: int, gigabytes: float):
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        info = kv_pool.get_device_pool_infos()[0].buffer_info
        self.pool = MHATokenToKVPoolHost(
            info, 1.0, gigabytes, page_size, "layer_first", pin_memory=False, device="cpu",
            device_capacity_tokens=kv_pool.size, start_layer=kv_pool.start_layer, end_layer=kv_pool.end_layer)
        self.page_size = page_size
        self._chunks: "OrderedDict[str, torch.Tensor]" = OrderedDict()  # key -> host slots, oldest use first
        self.evictions = 0

    def __contains__(self, key: str) -> bool:
        return key in self._chunks

    def __len__(self) -> int:
        return len(self._chunks)

    def put(self, key: str, kv: torch.Tensor) -> bool:
        """Keep `kv` ([2, layers, tokens, heads, dim]) under `key`, evicting the oldest entries for room."""
        if key in self._chunks:
            self._chunks.move_to_end(key)
            return True
        need = kv.shape[2]
        if need > self.pool.size - self.page_size:  # the host pool keeps one padding page
            return False
        while self.pool.available_size() < need and self._chunks:
            self.pool.free(self._chunks.popitem(last=False)[1])
            self.evictions += 1
        slots = self.pool.alloc(need)
        if slots is None:
            return False
        self.pool.kv_buffer[:, :, slots] = kv.to(self.pool.kv_buffer.dtype)
        self._chunks[key] = slots
        return True

    def get(self, key: str) -> torch.Tensor | None:
        slots = self._chunks.get(key)
        if slots is None:
            return None
        self._chunks.move_to_end(key)
        return self.pool.kv_buffer[:, :, slots]

    def pages_used(self) -> int:
        return sum(len(s) for s in self._chunks.values()) // self.page_size

    def pages_total(self) -> int:
        return self.pool.size // self.page_size - 1

    def clear(self) -> None:
        self._chunks.clear()
        self.pool.clear()


class FileTier:
    """Chunk KV persisted by key in a directory, through SGLang HiCache's file backend."""

    def __init__(self, path: str, fingerprint: str):
        from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig

        config = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
            enable_storage_metrics=False, is_page_first_layout=False, model_name="mepic",
            extra_config={"file_storage_path": path})
        self.files = HiCacheFile(config, file_path=path)
        self.fingerprint = fingerprint
        self.rejected = 0

    def path(self, key: str) -> str:
        return os.path.join(self.files.file_path, f"{key}{self.files.config_suffix}.bin")

    def __contains__(self, key: str) -> bool:
        return self.files.exists(key)

    def put(self, key: str, kv: torch.Tensor) -> bool:
        return self.files.set(key, envelope(kv.cpu(), self.fingerprint))  # skips a key already written

    def get(self, key: str, like: torch.Tensor) -> torch.Tensor | None:
        """The KV stored under `key`, shaped as `like`; None if absent, corrupt or another model's."""
        path = self.path(key)
        try:
            size = os.path.getsize(path)
        except OSError:
            return None
        expected = _HEADER.size + like.numel() * like.element_size()
        try:
            if size != expected:
                raise CorruptEntry(f"file of {size} bytes, expected {expected}")
            data = torch.empty(size, dtype=torch.uint8)
            if self.files.get(key, data) is None:
                return None
            return open_envelope(data, self.fingerprint, like)
        except (CorruptEntry, OSError) as e:
            self.rejected += 1
            logger.warning("MEPIC file tier: entry %s rejected, treated as a miss: %s", path, e)
            try:
                os.remove(path)  # a fresh compile writes it again
            except OSError:
                pass
            return None


class Tiers:
    """The tiers below the device pool, as one lookup: host first, then files."""

    def __init__(self, kv_pool, page_size: int, fingerprint: str, host_gb: float = 0.0,
                 storage_dir: str | None = None):
        self.device = DevicePool(kv_pool)
        self.page_size = page_size
        self.host = HostTier(kv_pool, page_size, host_gb) if host_gb > 0 else None
        self.files = FileTier(storage_dir, fingerprint) if storage_dir else None
        self.lookups: Counter = Counter()  # residency of each chunk when a compile looked it up
        self.loads: Counter = Counter()    # chunks copied back into the device pool, by tier

    def demote(self, key: str, slots: torch.Tensor) -> None:
        """The store is evicting this chunk from the device pool: keep a host copy.

        A chunk loaded back from the host is still there; its copy is only refreshed in the LRU.
        """
        if self.host is not None and self.host.get(key) is None:
            self.host.put(key, self.device.gather(slots))

    def persist(self, key: str, slots: torch.Tensor) -> None:
        """A chunk was just compiled: write it through to the file tier (once)."""
        if self.files is not None and key not in self.files:
            self.files.put(key, self.device.gather(slots))

    def fetch(self, key: str, num_slots: int) -> tuple[torch.Tensor, str] | None:
        """The chunk's KV (a copy: making room on the device may demote other chunks into the
        host tier) and the tier it came from; None when no tier has it whole and sound."""
        kv = self.host.get(key) if self.host is not None else None
        if kv is not None:
            return (kv.clone(), "host") if kv.shape[2] == num_slots else None
        if self.files is not None:
            kv = self.files.get(key, self.device.empty(num_slots))
            if kv is not None:
                if self.host is not None:
                    self.host.put(key, kv)
                return kv, "storage"
        return None

    def place(self, fetched: tuple[torch.Tensor, str], slots: torch.Tensor) -> None:
        kv, tier = fetched
        self.device.scatter(slots, kv)
        self.loads[tier] += 1

    def clear_host(self) -> None:
        if self.host is not None:
            self.host.clear()

    def stats(self) -> dict:
        out = {f"tier_lookups_{k}": self.lookups[k] for k in ("device", "host", "storage", "absent")}
        total = sum(self.lookups.values())
        for k in ("device", "host", "storage"):
            out[f"tier_hit_rate_{k}"] = round(self.lookups[k] / total, 4) if total else 0.0
        out["tier_loads_host"] = self.loads["host"]
        out["tier_loads_storage"] = self.loads["storage"]
        if self.host is not None:
            out.update(host_chunks=len(self.host), host_pages_used=self.host.pages_used(),
                       host_pages_total=self.host.pages_total(), host_evictions=self.host.evictions)
        if self.files is not None:
            out["storage_rejected"] = self.files.rejected
        return out
