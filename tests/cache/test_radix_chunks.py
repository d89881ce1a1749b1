"""The mepic radix cache with chunks, on SGLang's real paged allocator and RadixCache,
without a server or a model: the scheduler's calls (match, admit, allocate, insert,
release) are replayed by hand, so planning, injection of shared pages, compile
publishing, tenant isolation and page ownership are checked page by page."""

import time

import pytest
import torch

from array import array
from types import SimpleNamespace

from support.replay import (B, NUM_PAGES, allocate, apply_hooks, compile_all, compiled, evict_all, finish, kv_of, laid_out,
                            make_tree, new_request, planned, prepare_batch, release, replanned, request, serve,
                            serve_round)

from sglang_mepic.cache.compile_rows import is_compile_row, layout_of
from sglang_mepic.wire.report import Report


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


@pytest.fixture
def tree():
    return make_tree()


C1 = tuple(range(100, 140))  # 40 tokens: 3 pages, 2 of them canonical
C2 = tuple(range(200, 250))  # 50 tokens: 4 pages, 3 canonical


def test_compile_publishes_non_first_pages_and_a_request_reuses_them(tree):
    lay = request(C1, C2)
    compile_all(tree, lay)
    assert len(tree.store) == 2 and tree.store.canonical_pages() == 2 + 3
    req, row = serve(tree, *laid_out(lay))
    link = req.mepic
    # planned order: C1 pages 1-2, C2 pages 1-3, then prompt, C1 first block, C2 first block, question
    assert link.plan.order == (2, 3, 5, 6, 7, 0, 1, 4, 8)
    canonical = [p for key in link.keys for p in tree.store.peek(key)]
    assert row[:5] == canonical
    assert link.report == Report(recomputed_tokens=3 + 16 + 16 + 4, chunk_hits=2, chunk_misses=0,
                                 cached_tokens=24 + 34, compiled_tokens=0, residency=["device", "device"])
    # the request's ids were reordered to match
    assert list(req.origin_input_ids[:B]) == list(C1[B:2 * B])


def test_reuse_of_chunks_compiled_for_the_request_is_not_counted_as_cached(tree):
    lay = request(C1, C2)
    serve(tree, *compiled(lay.chunks[0]), rid="c1-earlier")  # C1 stored; C2 in no tier
    batch, _ = serve_round(tree, new_request(*laid_out(lay)))
    req = batch[-1]
    assert len(batch) == 2 and is_compile_row(batch[0])  # C2's compile row, right before it
    assert req.mepic.compiled == (1,)
    report = req.mepic.report
    assert report.compiled_tokens == 34 and report.cached_tokens == 24
    assert report.recomputed_tokens == 3 + 16 + 16 + 4  # what was computed in context is unchanged
    assert report.chunk_hits == 2 and report.chunk_misses == 0  # both reused, none in context
    assert report.residency == ["device", "absent"]


def test_a_chunk_no_tier_holds_is_computed_in_its_readers_batch(tree):
    """Issue 47: no internal request and no extra round. The first request that reads an absent
    chunk is planned with the chunk's canonical pages in its prefix; a compile row computing the
    chunk standalone goes in the same batch right before it, and the request's KV row points at
    the pages that row writes. Requests planned in the same round share one compile row."""
    lay = request(C1, C2)
    other = request(C2, tuple(range(300, 340)))
    first, second = new_request(*laid_out(lay), rid="a"), new_request(*laid_out(other), rid="b")
    start = tree.pages.available()
    batch, rows = serve_round(tree, first, second)
    c1, c2, _, c3, _ = batch
    assert [r.rid for r in batch][2::2] == ["a", "b"] and all(is_compile_row(r) for r in (c1, c2, c3))
    assert tree.compile_rows.made == 3  # C2's row is shared by both readers
    # Each reader's prefix is the canonical pages its compile rows computed, in plan order.
    canonical = {r.mepic.keys[0]: row[1:-1] for r, row in zip(batch, rows) if is_compile_row(r)}
    for req, row in ((first, rows[2]), (second, rows[4])):
        want = [p for key, _, n in req.mepic.plan.runs for p in canonical[key]]
        assert row[:len(want)] == want and 0 not in row
        assert req.mepic.compiled == (0, 1)
    # Those pages, and no others, are what the store now keeps for the chunks.
    assert {key: list(tree.store.peek(key)) for key in canonical} == canonical
    assert tree.compile_rows.pending == {} and tree.compile_rows.running == {}

    # Now stored: a request reading them makes no compile row.
    batch, _ = serve_round(tree, new_request(*laid_out(lay), rid="c"))
    assert len(batch) == 1 and batch[0].mepic.compiled == () and tree.compile_rows.made == 3
    # Everything went back or is evictable: nothing leaked.
    evict_all(tree)
    assert tree.pages.available() == start


def test_a_reader_waits_while_its_chunks_compile_row_runs_over_several_forwards(tree):
    """A compile row split by chunked prefill cannot be read by a row of its first forward: its
    readers sit out the rounds until its pages are stored (held back)."""
    from sglang_mepic.cache.prefill_round import hold_back

    lay = request(C1)
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, None, rid)
    reader = replanned(tree, new_request(*laid_out(lay), rid="r"))
    (row,) = reader.mepic.compiling.values()
    tree.residency.end_round()
    tree.compile_rows.admitted(row, row_key := reader.mepic.keys[0], None)  # parts of it still to come
    tree.compile_rows.end_round()
    assert hold_back(tree, [reader]) == [reader]
    tree.compile_rows.released(row, row_key)
    assert hold_back(tree, [reader]) == []


def test_a_request_planned_while_its_chunks_compile_row_is_in_flight_reads_its_pages(tree):
    """Under the overlap scheduler the next batch is planned before this one's results are processed:
    a request then reads the pages a compile row in the launched batch writes (forwards run in order),
    pinned like a stored chunk's, instead of computing the chunk again. Once that batch's forward
    has raised, nobody may (batch_guard drops the row's pages)."""
    from sglang_mepic.cache.prefill_round import hold_back

    lay = request(C1)
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, None, rid)
    first = replanned(tree, new_request(*laid_out(lay), rid="a"))
    (row,) = first.mepic.compiling.values()
    prepare_batch(tree, [replanned(tree, row), first])
    pages = tree.compile_rows.in_flight(first.mepic.keys[0])
    assert pages is not None and len(pages) == 2
    later = replanned(tree, new_request(*laid_out(request(C1, question=(5, 5))), rid="b"))
    assert hold_back(tree, [later]) == [] and later.mepic.compiling == {}
    assert later.mepic.found == ["device"] and set(pages) <= set(later.mepic.held)
    tree.residency.end_round()
    tree.compile_rows.failed(row)
    again = replanned(tree, new_request(*laid_out(request(C1, question=(6, 6))), rid="c"))
    assert len(again.mepic.compiling) == 1  # computed anew
    tree.residency.end_round()
    tree.compile_rows.end_round()


def test_a_reader_split_by_chunked_prefill_is_pointed_once(tree):
    """The reader's own extend may not fit one forward: its later parts run after its compile row
    finished and SGLang freed that row's request row. They read the reader's row as pointed at
    its first part (found by the review of issue 47: the scheduler died at the second part)."""
    from sglang_mepic.cache.extend import point_readers

    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, None, rid)
    reader = replanned(tree, new_request(*laid_out(request(C1, question=tuple(range(300, 340)))), rid="r"))
    (row,) = reader.mepic.compiling.values()
    prepare_batch(tree, [replanned(tree, row), reader])
    pointed = tree.req_to_token_pool.req_to_token[reader.kv.req_pool_idx].clone()
    held = list(reader.mepic.held)
    release(tree, row)
    row.kv.req_pool_idx = None  # as SGLang's ReqToTokenPool.free leaves a finished request
    point_readers(tree, SimpleNamespace(reqs=[reader]))  # the reader's next part
    assert torch.equal(tree.req_to_token_pool.req_to_token[reader.kv.req_pool_idx], pointed)
    assert reader.mepic.held == held  # no second reference
    release(tree, reader)


def test_a_request_that_needs_more_compile_rows_than_there_are_request_rows_makes_progress():
    """Each compile row takes a row of the request pool. A request whose rows do not all fit with it
    has the ones that fit added now, and waits for a round with room (found by the review of issue
    47: it returned without adding any, every round, and the queue behind it stalled)."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    from sglang_mepic.cache import batch_join

    tree = make_tree()
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, None, rid)
    reader = replanned(tree, new_request(*laid_out(request(C1, C2, tuple(range(300, 340)))), rid="r"))
    assert len(reader.mepic.compiling) == 3
    adder = SimpleNamespace(tree_cache=tree, can_run_list=[], new_chunked_req=None)
    tree.compile_rows.rows_left = lambda a: 2 - len(a.can_run_list)

    def add(adder, req, *args, **kwargs):  # SGLang's add_one_req, with room for anything
        adder.can_run_list.append(req)
        return AddReqResult.CONTINUE

    for row in reader.mepic.compiling.values():
        row.init_next_round_input = lambda tree_cache, row=row: None
    assert batch_join.add_request(add, adder, reader) is AddReqResult.OTHER
    assert len(adder.can_run_list) == 2 and all(is_compile_row(r) for r in adder.can_run_list)
    assert reader not in adder.can_run_list


def test_epic_and_cacheblend_readers_wait_for_their_chunks_to_be_stored():
    """They copy stored KV before their forward: a compile row in the same batch would not have
    written it yet. The compile row runs in this round, the reader in a later one."""
    for mode in ("epic-16", "cacheblend-0.15"):
        tree = make_tree(mode, canonical_from=0)
        lay = request(C1, C2)
        reader = new_request(*laid_out(lay), rid="r")
        batch, _ = serve_round(tree, reader)
        assert len(batch) == 2 and all(is_compile_row(r) for r in batch) and reader.mepic.wait
        batch, _ = serve_round(tree, reader)
        assert batch == [reader] and not reader.mepic.wait and reader.mepic.compiling == {}
        # Computed for it, in the round before: not a cache hit.
        report = reader.mepic.report
        assert report.chunk_hits == 2 and report.residency == ["absent", "absent"]
        assert report.compiled_tokens > 0 or mode.startswith("cacheblend")  # CacheBlend: substituted


def test_a_reader_does_not_wait_for_a_compile_row_that_ended_unreleased():
    """An aborted compile row can end on a path that never hands its KV back through the cache;
    a reader held back for its chunk would sit in the queue for ever, and its client with it.
    The next round stops holding its readers back; the chunk is computed anew."""
    from sglang_mepic.cache.prefill_round import hold_back

    tree = make_tree("cacheblend-0.15", canonical_from=0)
    lay = request(C1, C2)
    reader = new_request(*laid_out(lay), rid="r")
    batch, _ = serve_round(tree, reader)
    rows = [r for r in batch if is_compile_row(r)]
    assert rows and reader.mepic.wait
    key = layout_of(rows[0]).key
    evict_all(tree)  # the chunk is not stored
    row = rows[0]
    row.kv.holds_kv = True
    tree.compile_rows.running[key] = (row, None)  # admitted (it has a KV row), still running
    assert hold_back(tree, [reader]) == [reader]
    row.finished_reason = "abort"  # ended without a release
    assert hold_back(tree, [reader]) == [] and key not in tree.compile_rows.running
    row.finished_reason = None
    tree.compile_rows.running[key] = (row, None)
    row.kv.holds_kv = False  # SGLang took its KV row back (an abort mid chunked prefill), no release here
    assert hold_back(tree, [reader]) == [] and key not in tree.compile_rows.running


def test_cacheblend_pins_only_the_stored_chunks_that_fit_beside_its_prompt():
    """CacheBlend holds the stored pages of its chunks until slots for its whole prompt are allocated
    (it copies the stored KV into them): in a pool too small for both, it reuses the chunks that fit
    and computes the rest, makes no compile row for them, and so is never left waiting for room
    (found by tests/pages/e2e/test_abort_pages.py: such a request sat in the queue for ever)."""
    lay = request(C1, C2, tuple(range(300, 350)))  # chunks of 3, 4 and 4 pages
    reused = {}
    for num_pages in (64, 24, 20, 16):
        tree = make_tree("cacheblend-0.15", canonical_from=0, num_pages=num_pages)
        compile_all(tree, lay)
        req = planned(tree, *laid_out(lay))
        link = req.mepic
        need = -(-(link.size + req.sampling_params.max_new_tokens) // B) + 1  # its slots, a page to align
        assert len(link.held) + need <= num_pages - 1, (num_pages, len(link.held), need)  # SGLang: strictly less
        assert link.compiling == {} and not link.wait
        reused[num_pages] = link.found
        tree.residency.end_round()
    assert reused == {64: ["device"] * 3, 24: ["device", "device", "absent"], 20: ["device", "absent", "absent"],
                      16: ["absent"] * 3}, reused


def test_a_compile_row_is_greedy_and_generates_nothing():
    from sglang_mepic.cache.compile_rows import layout
    from sglang_mepic.cache.prefill_round import compile_req

    scheduler = SimpleNamespace(model_config=SimpleNamespace(hf_eos_token_id={2}, vocab_size=1000),
                                dllm_config=None, tokenizer=None, init_req_max_new_tokens=lambda req: None)
    parent = SimpleNamespace(extra_key="tenant", cache_salt="salt", lora_id=None, priority=None, routing_key=None)
    ids = layout(list(C1) + [-1] * 8, [(40, 8)], B, None).ids
    req = compile_req(scheduler, "row", array("q", ids), parent)
    # SGLang samples a batch by argmax only when every request in it has top_k <= 1.
    assert req.sampling_params.top_k <= 1 and req.sampling_params.max_new_tokens == 0
    assert (req.extra_key, req.cache_salt) == ("tenant", "salt")  # the reader's cache namespace
    # With LoRA, SGLang's Req appends the adapter to the extra_key it is given, and the parent's has
    # it already: the row's namespace must still be the parent's, not another tenant's (review of issue 47).
    lora_parent = SimpleNamespace(extra_key="tenantAL1", cache_salt=None, lora_id="L1", priority=None, routing_key=None)
    row = compile_req(scheduler, "row", array("q", ids), lora_parent)
    assert (row.extra_key, row.cache_salt, row.lora_id) == ("tenantAL1", None, "L1")


def test_compiled_after_a_sink_the_chunk_keeps_its_identity(tree):
    lay = request(C1, C2)
    compile_all(tree, lay, sink=5)
    assert len(tree.store) == 2 and tree.store.canonical_pages() == 2 + 3
    req, row = serve(tree, *laid_out(lay))
    assert req.mepic.report.chunk_hits == 2
    assert row[:5] == [p for key in req.mepic.keys for p in tree.store.peek(key)]


def test_chunked_prefill_checkpoints_a_planned_request_midway(tree):
    lay = request(C1, C2)
    compile_all(tree, lay)
    req, row = serve(tree, *laid_out(lay), checkpoint_at=7 * B + 3)
    again, row2 = serve(tree, *laid_out(lay))
    assert row2[:-1] == row[:-1] and again.mepic.report.recomputed_tokens == 4


def test_identical_request_matches_all_the_way(tree):
    lay = request(C1, C2)
    compile_all(tree, lay)
    _, row = serve(tree, *laid_out(lay))
    again, row2 = serve(tree, *laid_out(lay))
    assert row2[:-1] == row[:-1]
    # only the unaligned question page is computed again
    assert again.mepic.report.recomputed_tokens == 4


def test_reordered_chunks_share_the_same_canonical_pages(tree):
    compile_all(tree, request(C1, C2))
    _, row_a = serve(tree, *laid_out(request(C1, C2)))
    req_c, row_c = serve(tree, *laid_out(request(C2, C1, question=(5, 5))))
    assert set(row_c[:5]) == set(row_a[:5])
    assert req_c.mepic.report.recomputed_tokens == 3 + 16 + 16 + 2
    # holders of each canonical page: the store, the compile's tree node and both requests'
    # tree paths (the requests themselves let go when they were released)
    assert {tree.refs.count(p) for p in row_a[:5]} == {4}


def test_missing_chunk_is_a_miss_computed_in_context(tree):
    serve(tree, *compiled(request(C1).chunks[0]))
    req, row = serve(tree, *laid_out(request(C2, C1)))
    assert req.mepic.report.chunk_misses == 1 and req.mepic.report.chunk_hits == 1
    assert req.mepic.plan.order[:2] == (6, 7)  # C1's canonical pages, in C2-then-C1 layout


def test_namespaces_never_share(tree):
    lay = request(C1)
    compile_all(tree, lay, namespace="tenant-a")
    req, _ = serve(tree, *laid_out(lay), namespace="tenant-b")
    assert req.mepic.report.chunk_hits == 0 and req.mepic.plan.reused == ()


@pytest.mark.parametrize("spelled", ["None", "None\x1fNone"])
def test_a_tenant_cannot_spell_the_default_namespace(spelled):
    """A client's extra_key of "None" (or one holding the separator) once made the same chunk
    key as requests without one: the chunk store shared their chunks across tenants."""
    tree = make_tree()
    lay = request(C1)
    compile_all(tree, lay)  # the default tenant (no extra_key)
    req, _ = serve(tree, *laid_out(lay), namespace=spelled)
    assert req.mepic.report.chunk_hits == 0 and req.mepic.plan.reused == ()


def test_pages_return_to_the_pool_after_eviction(tree):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    start = tree.pages.available()
    compile_all(tree, request(C1, C2))
    serve(tree, *laid_out(request(C1, C2)))
    serve(tree, *laid_out(request(C2, C1, question=(4,))))
    serve(tree, *laid_out(request(C1, C2, prompt=(5, 5, 5))))
    # idle: everything allocated is evictable, as SGLang's idle leak check requires
    used = start - tree.pages.available()
    assert tree.evictable_size() == used * B
    assert tree.report.pages_in_use() == 0  # the tree and the store keep pages for reuse; nobody uses them
    assert tree.evict(EvictParams(num_tokens=NUM_PAGES * B)).num_tokens_evicted == used * B
    assert tree.pages.available() == start
    assert tree.refs.shared() == 0 and len(tree.store) == 0


def test_a_planned_request_holds_its_chunks_until_the_round_ends(tree):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    start = tree.pages.available()
    compile_all(tree, request(C1))
    idle_evictable = tree.evictable_size()
    planned(tree, *laid_out(request(C1)))  # the scheduler checks its budget right after this
    assert tree.evictable_size() == idle_evictable - 2 * B  # C1's canonical pages are spoken for
    tree.evict(EvictParams(num_tokens=NUM_PAGES * B))
    assert len(tree.store) == 1 and tree.store.canonical_pages() == 2
    tree.residency.end_round()  # not admitted: it lets go
    assert tree.evictable_size() == (start - tree.pages.available()) * B
    tree.evict(EvictParams(num_tokens=NUM_PAGES * B))
    assert tree.pages.available() == start and tree.refs.shared() == 0


def test_an_evicted_chunk_comes_back_from_the_host_tier_as_a_copy_plus_its_first_block():
    lay = request(C1, C2)
    compiled_c1 = compiled(lay.chunks[0])
    reports = {}
    for host_gb in (0.0, 1e-3):
        tree = make_tree(host_gb=host_gb)
        compile_all(tree, lay)
        again, _ = serve(tree, *compiled_c1)
        assert again.mepic.report == Report(residency=["device"], compiled_tokens=0)  # all in the tree
        computed = kv_of(tree, again.mepic.keys[0])
        evict_all(tree)
        req, _ = serve(tree, *compiled_c1)
        reports[host_gb] = req.mepic.report
        if host_gb:
            assert tree.tiers.loads["host"] == 1
            assert torch.equal(kv_of(tree, req.mepic.keys[0]), computed)  # the same KV, copied back
        user, _ = serve(tree, *laid_out(lay))
        # C1 is back on the device; C2 comes back from the host when the request is planned
        assert user.mepic.report.chunk_hits == (2 if host_gb else 1)
    assert reports[0.0] == Report(residency=["absent"], compiled_tokens=40)  # the whole chunk
    assert reports[1e-3] == Report(residency=["host"], compiled_tokens=16)  # its first block


def test_a_load_makes_room_by_evicting_what_nobody_holds():
    tree = make_tree(host_gb=1e-3, num_pages=12)
    start = tree.pages.available()
    compile_all(tree, request(C1, C2))  # 4 + 5 pages with the compiles' pad slots
    evict_all(tree)
    compile_all(tree, request((7,) * 70))  # 6 pages: the pool now holds only this chunk's compile
    req, _ = serve(tree, *compiled(request(C1, C2).chunks[1]))  # C2 (3 canonical pages) must evict to load
    assert req.mepic.found == ["host"] and tree.tiers.loads["host"] == 1
    evict_all(tree)
    assert tree.pages.available() == start


def test_a_load_that_finds_no_room_waits_for_the_next_plan():
    tree = make_tree(host_gb=1e-3, num_pages=12)
    compile_all(tree, request(C1))
    evict_all(tree)
    running = tree.refs.alloc(tree.pages.available())  # running requests hold every page
    first = planned(tree, *compiled(request(C1).chunks[0]))
    assert first.mepic.found == ["absent"] and len(tree.store) == 0  # no room to load it into
    tree.residency.end_round()  # the scheduler could not admit it either
    tree.refs.release(running)
    req, _ = finish(tree, replanned(tree, first))  # the next round: room now
    assert req.mepic.report == Report(residency=["host"], compiled_tokens=16)


def test_the_file_tier_serves_a_restarted_server_and_rejects_what_does_not_check(tmp_path, caplog):
    lay = request(C1)
    first = make_tree(storage_dir=str(tmp_path))
    compile_all(first, lay)
    assert first.tiers.storage.drain()  # written in the background
    kv = kv_of(first, next(iter(first.store._chunks)))
    restarted = make_tree(storage_dir=str(tmp_path))
    req, _ = serve(restarted, *compiled(lay.chunks[0]))
    assert req.mepic.report == Report(residency=["storage"], compiled_tokens=16)
    assert torch.equal(kv_of(restarted, req.mepic.keys[0]), kv)

    storage = restarted.tiers.storage
    path = storage._io.path(storage.storage_key(req.mepic.keys[0]))
    data = bytearray(open(path, "rb").read())
    data[200] ^= 0x01
    open(path, "wb").write(bytes(data))
    again = make_tree(storage_dir=str(tmp_path))
    req, _ = serve(again, *compiled(lay.chunks[0]))
    assert req.mepic.report == Report(residency=["absent"], compiled_tokens=40)  # rejected: computed
    assert again.tiers.storage.rejected == 1 and "checksum mismatch" in caplog.text


def test_epic_requests_copy_into_pages_of_their_own():
    """EPIC is planned like mepic from each chunk's second page on, but that prefix is a copy,
    made before the forward, in pages of the request's own: only the rest is computed."""
    tree = make_tree("epic-16", canonical_from=0)
    lay = request(C1, C2)
    compile_all(tree, lay)
    assert tree.store.canonical_pages() == 3 + 4  # the whole chunk is kept
    canonical = [p for pages in tree.store.chunks() for p in pages[1:]]  # C1's, then C2's
    held = {p: tree.refs.count(p) for pages in tree.store.chunks() for p in pages}
    rows = []
    for _ in range(2):
        req = planned(tree, *laid_out(lay))
        req.lock = tree.lock(req.last_node)
        assert tree.admission.admit(req)
        tree.residency.end_round()
        tree.admission.copy_private(req, reserve=0)
        allocate(tree, req)
        row = tree.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :len(req.origin_input_ids)]
        prefix = row[:req.prefix_len].to(torch.int64)
        assert req.prefix_len == (2 + 3) * B  # C1's pages 1-2, C2's pages 1-3
        assert not {s // B for s in prefix.tolist()} & set(canonical)  # a private copy ...
        assert torch.equal(tree.tiers.device.gather(prefix), tree.tiers.device.gather(tree.pages.slots(canonical)))
        assert req.mepic.report.recomputed_tokens == 3 + 16 + 16 + 4  # ... the rest is computed
        # the store's pages are let go at once: the copy is made
        assert {p: tree.refs.count(p) for p in held} == held
        rows.append(set(s // B for s in prefix.tolist()))
        release(tree, req)
    assert not rows[0] & rows[1]  # the second request does not read the first one's copy from the tree


def test_canonical_pages_are_never_matched_by_their_tokens_alone(tree):
    """A canonical page's KV was computed after its chunk's first block: a plain prompt with
    the same tokens must not be served it, nor may a chunk be served a plain prompt's KV."""
    from support.replay import new_request

    lay = request(C1, C2)
    compile_all(tree, lay)
    serve(tree, *laid_out(lay))
    plain = list(C1[B:]) + list(C2[B:]) + [1, 2, 3] * 20  # the tokens of the planned prefix
    req = replanned(tree, new_request(plain, None))
    assert req.prefix_len == 0
    serve(tree, plain, None)  # now the tree holds the plain prompt's own KV under those tokens
    again, row = serve(tree, *laid_out(lay))
    assert again.mepic.report.recomputed_tokens == 4  # its own earlier path, whole
    assert row[:5] == [p for key in again.mepic.keys for p in tree.store.peek(key)]


def test_eviction_inside_a_free_group_stops_when_enough_is_freed(tree):
    """SGLang's allocator returns pages freed in a free group only at its end; eviction there
    must still count what it frees (it used to watch the free count, empty the tree and say 0)."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    compile_all(tree, request(C1, C2))
    serve(tree, *laid_out(request(C1, C2)))
    start, evictable = tree.pages.available(), tree.evictable_size()
    allocator = tree.token_to_kv_pool_allocator
    allocator.free_group_begin()
    evicted = tree.evict(EvictParams(num_tokens=2 * B)).num_tokens_evicted
    assert 2 * B <= evicted < evictable
    assert tree.pages.available() == start and tree.evictable_size() == evictable - evicted
    allocator.free_group_end()
    assert tree.pages.available() == start + evicted // B


@pytest.mark.parametrize("blocks", [2, 3, 5])
def test_recompute_depth_at_or_above_a_chunks_pages(tmp_path, blocks):
    """Issue 29, defect 3: `--mepic-recompute-blocks N` with N at or above a chunk's page count
    asked the tiers for a negative page count (a crash inside match_prefix) and stored empty
    chunks. Such a chunk is computed whole in context and nothing of it is stored anywhere."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree = make_tree("mepic", canonical_from=blocks, host_gb=1e-3, storage_dir=str(tmp_path))
    chunks = [list(range(20, 20 + n)) for n in (17, 32, 33, 48, 70)]  # 2, 2, 3, 3 and 5 pages
    for _ in range(2):  # the second time round, lookups go through the tiers too
        for chunk in chunks:
            lay = request(chunk)
            compile_all(tree, lay)
            req, _ = serve(tree, *laid_out(lay))
            kept = tree.store.peek(req.mepic.keys[0])
            pages = lay.chunks[0].size // B
            assert (kept is not None) == (pages > blocks), (pages, blocks, kept)
            assert kept is None or len(kept) == pages - blocks
        tree.evict(EvictParams(num_tokens=NUM_PAGES * B))


def test_cacheblend_pages_match_no_other_request():
    """CacheBlend picks the slots it recomputes over a request's whole extend, so its blended KV
    is that request's alone: neither a plain request with the same tokens nor another blended
    request with the same layout may match it in the tree (a natural-order key let them)."""
    from support.replay import make_tree as make

    tree = make("cacheblend-0.15", canonical_from=0)
    lay = request(tuple(range(100, 148)), prompt=tuple(range(300, 316)))  # no pads: the chunk fills its pages
    assert not lay.pad_runs()
    compile_all(tree, lay)
    serve(tree, *laid_out(lay))
    ids, hints = laid_out(lay)
    again = planned(tree, ids, hints)
    assert again.prefix_len == 0 and again.mepic.private_key is not None
    tree.residency.end_round()
    plain = planned(tree, ids, None)
    assert plain.prefix_len == 0


def test_a_holders_mepic_cache_is_found_and_another_cache_is_none(tree):
    """The one way the patches and the scheduler-side parts reach the cache (issue 72)."""
    from sglang_mepic.cache.radix_cache import mepic_cache

    assert mepic_cache(SimpleNamespace(tree_cache=tree)) is tree
    assert mepic_cache(SimpleNamespace(tree_cache=make_tree(sglang=True))) is None
    assert mepic_cache(SimpleNamespace()) is None  # a holder without a cache (SGLang's disaggregation stubs)
