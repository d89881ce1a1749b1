"""Where a chunk's canonical KV lives below the device pool: host memory, then shared storage.

The device pool holds a chunk's canonical pages while the chunk store keeps it.
When the store evicts a chunk under memory pressure, its KV is copied to the
host tier (`--mepic-host-tier-gb`) instead of being lost; a later lookup copies
it back into fresh device pages, so the chunk costs a copy plus the per-request
first-block recompute instead of a standalone compile. Below that, shared
storage (`--mepic-storage-backend`, storage.py: a directory or Mooncake Store)
keeps every compiled chunk by hash, so other server instances, or this one
after a restart, reuse chunks they never computed.

Chunk keys hash the chunk's tokens with the model fingerprint (layout.span_hash),
never its position, so an entry is valid wherever the chunk appears. Shared storage
keys entries by the chunk key and every setting that shapes the KV bytes (storage.py).

The host tier's memory is SGLang's HiCache host pool (`MHATokenToKVPoolHost`,
layer-first layout): its sizing in GB against the host's free memory, its page
allocator and its buffer. Its transfer methods are not used: on CPU they need
sgl_kernel's `transfer_kv_*` ops, which the CPU install does not have, so the
copies are plain tensor indexing (what the `direct` io backend does).

Lookups never read storage on the scheduler's thread. `want`/`poll` never block
and never copy: a storage
entry is read and checked by a background worker (prefetch.py) and what it found
is remembered, so the scheduler may ask each round at the cost of a dict lookup;
`take` then hands over the KV to place. A host-tier copy is made on the
scheduler's thread, by `take`: it is a copy in memory the size of the device
copy that follows it, and the host pool is the scheduler's own (the store demotes
into it), so a worker could not read it safely.

Under tensor parallelism what a rank finds is its own (a read that timed out, an
outage, a remembered absence), and every rank must plan alike. So each round the
ranks agree first (`agree_round`, one MIN all-reduce over the TP CPU group,
agreement.py): a chunk is loaded only where every rank has it ready, and the
round's `want`/`poll`/`take` give that answer. The host tier is every rank's
alike: sized to the smallest rank's pool, it demotes, evicts and loads the same
chunks on every rank. At TP 1 nothing is agreed and nothing is sent.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import TYPE_CHECKING, cast

import torch
from sglang.srt.mem_cache.memory_pool import move_kv_cache_native

from sglang_mepic.tiers.agreement import Agreement
from sglang_mepic.tiers.prefetch import ABSENT, PENDING, Prefetch
from sglang_mepic.tiers.storage import Storage

if TYPE_CHECKING:
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

# What a rank found of a chunk, as the TP ranks' MIN compares it (agreement.py): the chunk is loaded only
# where every rank has it ready, waited for while any still reads it, computed where any lacks it.
CODES = {ABSENT: 0, PENDING: 1, "storage": 2, "host": 2}
READY = 2


class DevicePool:
    """The device KV buffers seen as [2, layers, tokens, heads, dim] at given token slots."""

    def __init__(self, kv_pool: MHATokenToKVPool):
        # SGLang declares the buffers None before it makes them: per layer, one tensor each.
        self.k = cast("list[torch.Tensor]", kv_pool.k_buffer)
        self.v = cast("list[torch.Tensor]", kv_pool.v_buffer)

    def gather(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.stack([torch.stack([b[slots] for b in self.k]), torch.stack([b[slots] for b in self.v])])

    def scatter(self, slots: torch.Tensor, kv: torch.Tensor) -> None:
        for layer, (k, v) in enumerate(zip(self.k, self.v)):
            k[slots] = kv[0, layer].to(k.device, k.dtype)
            v[slots] = kv[1, layer].to(v.device, v.dtype)

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy the KV at slots `src` to slots `dst`, in every layer, without a staging copy."""
        move_kv_cache_native(self.k, self.v, dst, src.to(dst.device))

    def empty(self, num_slots: int, device: str = "cpu") -> torch.Tensor:
        k = self.k[0]
        return torch.empty((2, len(self.k), num_slots, *k.shape[1:]), dtype=k.dtype, device=device)


class HostTier:
    """A bounded LRU of chunk KV in SGLang's HiCache host pool."""

    def __init__(self, kv_pool: MHATokenToKVPool, page_size: int, gigabytes: float,
                 agreement: Agreement | None = None):
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        info = kv_pool.get_device_pool_infos()[0].buffer_info
        self.pool = MHATokenToKVPoolHost(
            info, 1.0, gigabytes, page_size, "layer_first", pin_memory=False, device="cpu",
            device_capacity_tokens=kv_pool.size, start_layer=kv_pool.start_layer, end_layer=kv_pool.end_layer)
        self.page_size = page_size
        # Under TP each rank's pool is sized by SGLang from the GB and that rank's bytes per token (its share
        # of the heads): equal shares give equal pools, but a pool one page larger on one rank would evict
        # other entries than the others'. Every rank keeps chunks within the smallest, so the same demotions
        # evict the same entries on every rank (agreement.py; one all-reduce at start, none at TP 1).
        self.size = (agreement or Agreement()).min_int(self.pool.size)
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
        if need > self.size - self.page_size:  # the host pool keeps one padding page
            return False
        while self._free() < need and self._chunks:
            self.pool.free(self._chunks.popitem(last=False)[1])
            self.evictions += 1
        slots = self.pool.alloc(need)
        if slots is None:
            return False
        self.pool.kv_buffer[:, :, slots] = kv.to(self.pool.kv_buffer.dtype)
        self._chunks[key] = slots
        return True

    def _free(self) -> int:
        """Host slots free for chunks within the agreed size (the pool itself may be larger)."""
        return self.pool.available_size() - (self.pool.size - self.size)

    def tokens(self, key: str) -> int:
        return len(self._chunks[key])

    def get(self, key: str) -> torch.Tensor | None:
        slots = self._chunks.get(key)
        if slots is None:
            return None
        self._chunks.move_to_end(key)
        return self.pool.kv_buffer[:, :, slots]

    def pages_used(self) -> int:
        return sum(len(s) for s in self._chunks.values()) // self.page_size

    def pages_total(self) -> int:
        return self.size // self.page_size - 1

    def clear(self) -> None:
        self._chunks.clear()
        self.pool.clear()


class Tiers:
    """The tiers below the device pool, as one lookup: host first, then shared storage."""

    def __init__(self, kv_pool: MHATokenToKVPool, page_size: int, host_gb: float = 0.0, storage: Storage | None = None,
                 agreement: Agreement | None = None):
        self.device = DevicePool(kv_pool)
        self.page_size = page_size
        self.agreement = agreement or Agreement()
        self.host = HostTier(kv_pool, page_size, host_gb, self.agreement) if host_gb > 0 else None
        self.storage = storage
        if storage is not None:  # entries are keyed by the page size and the KV dtype too (storage.py)
            k = self.device.k[0]
            storage.bind(page_size=page_size,
                         kv_dtype=f"{getattr(kv_pool, 'dtype', k.dtype)}/{getattr(kv_pool, 'store_dtype', k.dtype)}")
        self.prefetch = Prefetch(storage) if storage is not None else None
        self.lookups: Counter = Counter()  # where each chunk occurrence of an admitted request was found
        self.loads: Counter = Counter()    # chunks copied back into the device pool, by tier
        # Under TP, with a tier below (agreement.py): what the ranks agreed of each chunk this round asked
        # about, and the fetched KV of those agreed loadable, kept for the round whatever the prefetch
        # memory drops meanwhile. At TP 1 both stay empty and every answer is this process's own.
        self.agrees = not self.agreement.alone and (self.host is not None or self.prefetch is not None)
        self._agreed: dict[str, str] = {}
        self._held: dict[str, torch.Tensor] = {}
        self.rounds_agreed = 0  # rounds whose chunks the ranks agreed on (one collective each)
        self.overruled = 0      # chunks this rank had ready that another rank had not: computed instead

    def agree_round(self, wanted: list[tuple[str, int]]) -> None:
        """Under TP, before a round plans anything: what each rank has of the chunks `wanted` ((key, KV
        slots), the same list on every rank: their stores agree), made one answer by a MIN over the ranks
        in one collective (none for an empty list). Until `end_round`, `want`, `poll` and `take` give that
        answer: a chunk every rank has ready is loaded, one any rank still reads is waited for, one any
        rank lacks is computed (a rank that has it keeps it for a later round, or its prefetch memory
        drops it). Nothing at TP 1, nor without a tier below."""
        if not self.agrees:
            return
        self.end_round()
        found = [self._found(key, slots, start=True) for key, slots in wanted]
        agreed = self.agreement.min_codes([CODES[where] for where in found])
        self.rounds_agreed += bool(wanted)
        for (key, _), where, code in zip(wanted, found, agreed):
            if code >= READY:
                self._agreed[key] = where
                kv = self.prefetch.fetched(key) if where == "storage" and self.prefetch is not None else None
                if kv is not None:
                    self._held[key] = kv
                continue
            self._agreed[key] = PENDING if code == CODES[PENDING] else ABSENT
            self.overruled += code == CODES[ABSENT] and CODES[where] >= READY

    def agreed(self) -> dict[str, str]:
        """This round's agreed answers, in the order asked (empty at TP 1 and outside a round)."""
        return dict(self._agreed)

    def end_round(self) -> None:
        self._agreed.clear()
        self._held.clear()

    def demote(self, key: str, slots: torch.Tensor) -> bool:
        """The store is evicting this chunk from the device pool: keep a host copy. Whether the host holds it.

        A chunk loaded back from the host is still there; its copy is only refreshed in the LRU.
        """
        if self.host is None:
            return False
        if key in self.host:
            self.host.get(key)  # refreshes its place in the LRU
            return True
        return self.host.put(key, self.device.gather(slots))

    def persist(self, key: str, slots: torch.Tensor) -> None:
        """A chunk was just compiled: write it through to shared storage (in the background, once)."""
        if self.storage is not None and self.prefetch is not None:  # the one is made with the other
            self.storage.put(key, self.device.gather(slots))
            self.prefetch.forget(key)

    def want(self, key: str, num_slots: int) -> str:
        """Where the chunk can be loaded from now, without blocking and without copying: "host"
        or "storage" (`take` gives its KV), PENDING while its storage entry is read in the
        background (ask again), or ABSENT when no tier has it whole and sound. A read is started
        unless one is in flight or its outcome is remembered (prefetch.py)."""
        return self._where(key, num_slots, start=True)

    def poll(self, key: str, num_slots: int) -> str:
        """As `want`, but never starts a read: ABSENT for a chunk nothing was asked of."""
        return self._where(key, num_slots, start=False)

    def _where(self, key: str, num_slots: int, start: bool) -> str:
        if not self.agrees:
            return self._found(key, num_slots, start)
        agreed = self._agreed.get(key)
        if agreed is not None:
            return agreed
        # Not agreed this round (evicted since it began, or asked outside a round): the host tier's answer
        # is every rank's (each demotes and loads alike, within one agreed size); a storage read's is this
        # rank's alone, so a read is started for a later round and the chunk is absent now.
        found = self._found(key, num_slots, start)
        return found if found == "host" else ABSENT

    def _found(self, key: str, num_slots: int, start: bool) -> str:
        """What this rank alone has of the chunk now (want's answer at TP 1)."""
        if self.host is not None and key in self.host:
            return "host" if self.host.tokens(key) == num_slots else ABSENT
        if self.prefetch is None:
            return ABSENT
        got = self.prefetch.poll(key)
        if got is None and start:
            got = self.prefetch.want(key, self.device.empty(num_slots, "meta"))
        if got is None or isinstance(got, str):
            return got or ABSENT
        return "storage" if got.shape[2] == num_slots else ABSENT

    def take(self, key: str, num_slots: int) -> tuple[torch.Tensor, str] | None:
        """The chunk's KV ([2, layers, tokens, heads, dim]) and its tier, when `want` found it "host" or
        "storage"; None otherwise. Never reads storage. Call it once the device pages are
        allocated: making room may demote chunks into the host tier, even over this one."""
        kv = self.host.get(key) if self.host is not None else None
        if kv is not None:  # host.get indexes the host pool with a slot tensor: already a copy
            return (kv, "host") if kv.shape[2] == num_slots else None
        if self.agrees and key not in self._held:  # under TP, storage only where the ranks agreed this round
            return None
        kv = self.prefetch.fetched(key) if self.prefetch is not None else None
        if kv is None:  # agreed loadable this round: kept, though the prefetch memory dropped it since
            kv = self._held.get(key)
        if kv is None or kv.shape[2] != num_slots:
            return None
        if self.host is not None:  # kept on the host too, for when the store evicts it again
            self.host.put(key, kv)
        return kv, "storage"

    def place(self, fetched: tuple[torch.Tensor, str], slots: torch.Tensor, key: str | None = None) -> None:
        """Copy fetched KV into device pages; with its `key`, a prefetched copy is let go."""
        kv, tier = fetched
        self.device.scatter(slots, kv)
        self.loads[tier] += 1
        if key is not None and tier == "storage" and self.prefetch is not None:
            self.prefetch.taken(key)
            self._held.pop(key, None)

    def clear_host(self) -> None:
        """Empty the host tier, and forget what storage reads fetched or found absent."""
        if self.host is not None:
            self.host.clear()
        if self.prefetch is not None:
            self.prefetch.clear()
        self.end_round()

    def stats(self) -> dict:
        out: dict[str, float] = {f"tier_lookups_{k}": self.lookups[k] for k in ("device", "host", "storage", "absent")}
        total = sum(self.lookups.values())
        for k in ("device", "host", "storage"):
            out[f"tier_hit_rate_{k}"] = round(self.lookups[k] / total, 4) if total else 0.0
        out["tier_loads_host"] = self.loads["host"]
        out["tier_loads_storage"] = self.loads["storage"]
        if self.agrees:  # TP with a tier below only: at TP 1 nothing is agreed
            out.update(tier_rounds_agreed=self.rounds_agreed, tier_overruled=self.overruled)
        if self.host is not None:
            out.update(host_chunks=len(self.host), host_pages_used=self.host.pages_used(),
                       host_pages_total=self.host.pages_total(), host_evictions=self.host.evictions)
        if self.storage is not None and self.prefetch is not None:
            out.update(self.storage.stats())
            out.update(self.prefetch.stats())
        return out
