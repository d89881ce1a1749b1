"""Replays the scheduler's cache calls (match, admit, allocate, insert, release) on
the mepic radix cache over SGLang's real paged allocator, without a server or a model."""

import random
import time
from array import array
from types import SimpleNamespace

import torch

from sglang_mepic import modes
from sglang_mepic.wire import hint
from sglang_mepic.wire.slots import PAD_FILL_ID
from sglang_mepic.wire.layout import PAD_ID, Kind, Piece, Placement, Segment, layout, span_hash


def apply_hooks():
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_mepic import plugin

    plugin.register()
    HookRegistry.apply_hooks()


B = 16
NUM_PAGES = 128


class Rows:
    """SGLang's req_to_token pool, reduced to what the cache touches: rows of KV slots."""

    def __init__(self, num_rows: int, row_len: int):
        self.req_to_token = torch.zeros((num_rows, row_len), dtype=torch.int32)
        self.free_rows = list(range(num_rows - 1, -1, -1))

    def write(self, indices, values):
        self.req_to_token[indices] = values


def make_tree(mode="mepic", canonical_from=1, host_gb=0.0, storage_dir=None, num_pages=NUM_PAGES, sglang=False,
              eviction_policy="lru", rows=16, chunk_store="pool"):
    """The mepic radix cache on a small real KV pool (or, with `sglang`, SGLang's own RadixCache);
    `eviction_policy`: SGLang's --radix-eviction-policy; `rows`: requests (compile rows too) at once;
    `chunk_store`: --mepic-chunk-store."""
    import dataclasses

    from sglang_mepic import env

    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_mepic.cache.radix_cache import MepicRadixCache
    from sglang_mepic.tiers.levels import Tiers
    from sglang_mepic.tiers.storage import Storage

    kv = MHATokenToKVPool(num_pages * B, B, torch.float32, 1, 4, 2, "cpu", False, start_layer=0, end_layer=1)
    for buffer in (*kv.k_buffer, *kv.v_buffer):
        buffer.normal_()  # stands for computed KV, so that copies between tiers can be checked
    allocator = PagedTokenToKVPoolAllocator(num_pages * B, B, torch.float32, "cpu", kv, False)
    params = CacheInitParams(disable=False, req_to_token_pool=Rows(rows, min(num_pages * B, 1 << 14)),
                             token_to_kv_pool_allocator=allocator, page_size=B, eviction_policy=eviction_policy)
    if sglang:
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params)
    shared = None
    if storage_dir is not None:
        shared = Storage("file", {"file_storage_path": storage_dir}, "tiny", timeout=10)
        assert shared.connected()
    tree = MepicRadixCache(params, model_fingerprint="tiny", mode=modes.parse_mode(mode),
                           canonical_from=canonical_from,
                           tiers=Tiers(kv, B, host_gb=host_gb, storage=shared),
                           settings=dataclasses.replace(env.settings(), chunk_store=chunk_store))
    return tree


def request(*chunks, prompt=(1, 2, 3), question=(9, 8, 7, 6)):
    pieces = [Piece(Kind.PROMPT, prompt)] + [Piece(Kind.CHUNK, c) for c in chunks] + [Piece(Kind.PROMPT, question)]
    return layout(pieces, B, Placement.TRAILING)


def envelope(action: dict):
    """A kv_hints envelope holding one encoded action (hint.encode)."""
    return SimpleNamespace(actions=[SimpleNamespace(**action)])


def laid_out(lay):
    """What the tokenizer side sends for a laid-out request."""
    ids = [PAD_FILL_ID if t == PAD_ID else t for t in lay.slot_tokens()]
    h = hint.Hint(chunks=tuple((s.start, s.end) for s in lay.chunks), pads=tuple(lay.pad_runs()))
    return ids, envelope(hint.encode(h))


def compiled(seg, sink=None):
    """The compile row the scheduler makes for one chunk: its ids and its layout, which
    `new_request` marks it with (compile_rows.LAYOUTS) in place of a hint."""
    from sglang_mepic.cache import compile_rows

    pads = ([(0, seg.lead_pad)] if seg.lead_pad else []) + \
        ([(seg.size - seg.tail_pad, seg.tail_pad)] if seg.tail_pad else [])
    lay = compile_rows.layout(seg.padded_tokens(), pads, B, sink)
    return list(lay.ids), lay


def pad_runs(kv_hints) -> list[tuple[int, int]]:
    """The pad runs a request's hint lays out (none when it is not laid out in slots)."""
    h = hint.decode(kv_hints)
    return list(h.pads) if h is not None and h.laid_out else []


def chunks_from_hints(kv_hints, num_tokens: int) -> list[tuple[int, int]]:
    """The chunk spans a request's hint carries (empty if none), each checked to lie in its tokens."""
    h = hint.decode(kv_hints, num_slots=num_tokens)
    return list(h.chunks) if h is not None else []


def chunk_hash(seg: Segment, placement: Placement, page_size: int, model_fingerprint: str,
               namespace: str | None) -> str:
    """The key of a chunk segment, as the cache computes it from the request's padded slots."""
    return span_hash(seg.padded_tokens(), placement, page_size, model_fingerprint, namespace)


class FakeReq(SimpleNamespace):
    """A request as the cache sees it; weak-referenceable, as SGLang's Req is (side_table.py)."""

    finished_reason = None

    def finished(self) -> bool:  # as SGLang's Req
        return self.finished_reason is not None


def new_request(ids, hints, namespace=None, rid="r"):
    """A request as the tokenizer sends it (or, with a compile row's layout for `hints`, as the
    scheduler makes a compile row), before the scheduler has seen it."""
    from sglang_mepic.cache import compile_rows

    row = isinstance(hints, compile_rows.CompileLayout)
    req = FakeReq(rid=rid, origin_input_ids=array("q", ids), output_ids=array("q"),
                          kv_hints=None if row else hints,
                          extra_key=namespace, cache_salt=None, priority=0, lock=None, last_node=None,
                          sampling_params=SimpleNamespace(max_new_tokens=8),
                          kv=SimpleNamespace(req_pool_idx=None, cache_protected_len=0, cache_inserted_len=0,
                                             swa_evict_floor=0))
    if row:
        compile_rows.LAYOUTS.set(req, hints)
    return req


def planned(tree, ids, hints, namespace=None, rid="r"):
    """A request as the scheduler has it right after matching it (planned, not admitted): held
    back, round after round, while its chunks' storage entries are read (as the scheduler holds it)."""
    from sglang_mepic.cache.prefill_round import hold_back
    from sglang_mepic.cache.radix_cache import MepicRadixCache

    req = new_request(ids, hints, namespace, rid)
    if isinstance(tree, MepicRadixCache):
        waited = time.monotonic()
        while hold_back(tree, [req]):
            assert time.monotonic() - waited < 60, "held back for a minute"
            time.sleep(0.001)
    return replanned(tree, req)


def replanned(tree, req):
    """The request matched again, as in the next scheduling round."""
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    req.full_untruncated_fill_ids = req.origin_input_ids + req.output_ids
    key = RadixKey(req.full_untruncated_fill_ids, req.extra_key, limit=len(req.origin_input_ids) - 1)
    match = tree.match_prefix(MatchPrefixParams(key=key, req=req))
    req.prefix_len, req.last_node = match.device_prefix_len, match.last_device_node
    return req


def pages_to_allocate(req) -> int:
    return -(-(len(req.origin_input_ids) - req.prefix_len) // B)


def allocate(tree, req):
    """Give an admitted request its KV row (prefix + fresh pages), evicting first when short,
    as SGLang's allocation does. The scheduler's budget check must have made this possible."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    allocator = tree.token_to_kv_pool_allocator
    prefix = tree.prefix_device_indices(req)
    need = pages_to_allocate(req) * B
    if need > allocator.available_size():
        tree.evict_for_alloc(EvictParams(num_tokens=need - allocator.available_size()))
    new = allocator.alloc(need)
    assert new is not None, f"admitted, yet {need} slots cannot be allocated"
    row = torch.cat([prefix.to(torch.int64), new.to(torch.int64)])
    req.kv.req_pool_idx = tree.req_to_token_pool.free_rows.pop()
    tree.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :len(row)] = row.to(torch.int32)
    req.kv.cache_protected_len = req.prefix_len
    req.kv.allocated = req.kv.kv_allocated_len = len(row)
    if hasattr(tree, "report"):  # the mepic cache samples its figures as prepare_extend does; SGLang's has none
        tree.report.sample()


def release(tree, req, checkpoint_at=None, cache=True):
    """A running request ends: an optional chunked-prefill checkpoint midway, then, as
    SGLang's release_kv_cache, the tree keeps what it can key (unless aborted) and the rest
    of the row goes back."""
    if checkpoint_at is not None:
        tree.checkpoint(req, up_to=checkpoint_at)
    if cache:
        tree.checkpoint(req, up_to=len(req.origin_input_ids))
    row = tree.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
    tree.token_to_kv_pool_allocator.free(row[req.kv.cache_protected_len:req.kv.allocated].to(torch.int64))
    tree.unlock(req.lock)
    req.lock = None
    tree.on_release(req, checkpointed=cache)
    tree.req_to_token_pool.free_rows.append(req.kv.req_pool_idx)


def serve(tree, ids, hints, namespace=None, checkpoint_at=None, rid="r"):
    """One request through the scheduler's cache calls; returns (req, its row of pages)."""
    return finish(tree, planned(tree, ids, hints, namespace, rid), checkpoint_at)


def finish(tree, req, checkpoint_at=None):
    """Admit, allocate, compute (nothing), cache and release a planned request."""
    req.lock = tree.lock(req.last_node)
    if hasattr(tree, "admission") and tree.admission.admit(req):
        tree.admission.copy_private(req, reserve=0)  # EPIC's copy, as extend.prepare_extend makes it
    allocate(tree, req)
    size = len(req.origin_input_ids)
    row = tree.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :size].tolist()
    release(tree, req, checkpoint_at)
    return req, [s // B for s in row[::B]]


def prepare_batch(tree, batch):
    """A planned prefill batch (compile rows before their readers) as SGLang's prepare_for_extend
    takes it with the mepic hooks (extend.prepare_extend): admitted, the round's others let go,
    allocated, readers pointed at their compile rows' pages; then the round ends."""
    from sglang_mepic.cache.extend import point_readers

    admitted = []
    for req in batch:
        req.lock = tree.lock(req.last_node)
        if tree.admission.admit(req):
            admitted.append(req)
    tree.residency.end_round()
    for req in admitted:
        tree.admission.copy_private(req, reserve=0)
    for req in batch:
        allocate(tree, req)
    point_readers(tree, SimpleNamespace(reqs=batch))
    tree.compile_rows.end_round()


def admit_round(tree, reqs):
    """One prefill round up to its forward, as the scheduler runs it (prefill_round.py, batch_join.py,
    extend.py): each request planned, the compile rows its plan reads put in the batch right before it
    (each once), the batch admitted and allocated, its readers pointed at the compile rows' pages. A
    request that waits for its chunks to be stored (EPIC, CacheBlend) is left out. Returns the batch,
    every row of it still held."""
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, parent.extra_key, rid)
    batch = []
    for req in reqs:
        replanned(tree, req)
        for key, row in req.mepic.compiling.items():
            if not any(r is row for r in batch):
                batch.append(replanned(tree, row))
            req.mepic.made_for.add(key)  # as batch_join.add_request marks the rows it adds for a request
        if not req.mepic.wait:
            batch.append(req)
    prepare_batch(tree, batch)
    return batch


def serve_round(tree, *reqs):
    """One prefill round (`admit_round`), then every row released, compile rows first. Returns the batch
    and each row's pages."""
    batch = admit_round(tree, reqs)
    rows = [tree.req_to_token_pool.req_to_token[r.kv.req_pool_idx, :len(r.origin_input_ids)].tolist() for r in batch]
    for req in batch:
        release(tree, req)
    return batch, [[s // B for s in row[::B]] for row in rows]


def compile_all(tree, lay, namespace=None, sink=None):
    for seg in lay.chunks:
        serve(tree, *compiled(seg, sink), namespace=namespace)


def kv_of(tree, key):
    return tree.tiers.device.gather(tree.pages.slots(tree.store.peek(key)))


def evict_all(tree):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree.evict(EvictParams(num_tokens=NUM_PAGES * B))
    assert len(tree.store) == 0


def prioritise(tree, waiting, policy="lpm"):
    """SGLang sorting the waiting queue in place as a round begins, with a cache-aware
    `--schedule-policy` (SchedulePolicy.calc_priority: it matches every waiting request)."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy

    for req in waiting:
        if not hasattr(req, "_compute_max_prefix_len"):  # what SGLang's Req says without logprobs
            req._compute_max_prefix_len = lambda input_len: input_len - 1
    SchedulePolicy(policy, tree, False, False, False).calc_priority(waiting)


def budget(tree) -> int:
    """What the scheduler's memory check counts as room for a request: free + evictable slots."""
    return tree.pages.available() * B + tree.evictable_size()


# The workload eval.bench.cache, eval.bench.step and the cost tests fill a tree with.

def chunk_tokens(i: int, pages: int = 4) -> tuple[int, ...]:
    """Chunk `i`'s tokens: `pages` pages once laid out (3 slots short of them, so its pads pad it there)."""
    rng = random.Random(i if pages == 4 else f"{pages}:{i}")  # 4 pages: eval.bench.cache's chunks as they were
    return tuple(rng.randrange(10, 4000) for _ in range(pages * B - 3))


def plain_ids(i: int, groups: int = 50) -> list[int]:
    """A plain request of 8 pages whose first 2 it shares with every `groups`-th request."""
    rng = random.Random(10 ** 6 + i)
    return [1 + i % groups] * (2 * B) + [rng.randrange(10, 4000) for _ in range(6 * B)]


def chunked(i: int, chunks, pages: int = 4):
    """A laid-out request reading chunks `chunks` (of `pages` pages each, `chunk_tokens`) between its prompt and
    question."""
    return request(*(chunk_tokens(c, pages) for c in chunks), prompt=(5, 6, 7, 1 + i % 97), question=(9, 8, 7))


def cached_pages(tree) -> int:
    """Pages of the pool not free: what the tree, the store and running requests hold."""
    allocator = tree.token_to_kv_pool_allocator
    return (allocator.size - allocator.available_size()) // B


def filled(pages: int):
    """(a mepic tree holding `pages` cached pages, requests sent), filled as eval.bench.cache fills it: plain
    requests of 8 pages sharing 2, and requests of 4 stored chunks; asked `evictable_size` as it fills, as the
    scheduler asks at every step."""
    tree = make_tree(num_pages=int(pages * 1.25) + 64)
    i = 0
    while cached_pages(tree) < pages:
        if i % 2 == 0:
            serve(tree, plain_ids(i, groups=7), None)
        else:
            lay = chunked(i, range(2 * i, 2 * i + 4))  # two new chunks, two of the last request's
            compile_all(tree, lay)
            serve(tree, *laid_out(lay))
        if i % 8 == 0:
            tree.evictable_size()
        i += 1
    tree.evictable_size()
    return tree, i
