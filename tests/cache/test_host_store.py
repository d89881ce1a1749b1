"""EPIC with its chunks in host memory (`--mepic-chunk-store host`), on the real paged allocator without a
server: what a request loads and holds, and that a request whose chunk cannot be loaded makes progress."""

import pytest
import torch

from support.replay import B, apply_hooks, compiled, laid_out, make_tree, new_request, planned, request, serve, \
    serve_round

from sglang_mepic.cache.compile_rows import is_compile_row

C1 = tuple(range(100, 164))  # 64 tokens: 4 pages, the first recomputed by epic-16


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


def host_tree(**kw):
    return make_tree("epic-16", canonical_from=0, chunk_store="host", **kw)


def test_a_request_loads_and_holds_only_the_pages_past_each_chunks_first_block():
    """EPIC recomputes each chunk's first K tokens in context: loading them too would hold a page per
    chunk the plan never reads, until the request ends."""
    tree = host_tree(host_gb=1e-3)
    lay = request(C1)
    first, _ = serve(tree, *compiled(lay.chunks[0]))  # the compile: to the host, not kept in the pool
    assert len(tree.store) == 0 and len(tree.tiers.host) == 1
    computed = tree.tiers.host.get(first.mepic.keys[0])
    reader = planned(tree, *laid_out(lay))
    assert reader.mepic.found == ["host"]
    assert len(reader.mepic.held) == len(C1) // B - 1  # 3 pages, not 4
    held = tree.pages.slots(reader.mepic.held)
    assert torch.equal(tree.tiers.device.gather(held), computed[:, :, B:])  # the chunk's KV after its first block
    assert reader.prefix_len == len(held)  # and they are what its prefix reads
    tree.residency.end_round()
    assert reader.mepic.held == []


def test_a_chunk_gone_from_the_host_after_its_compile_is_computed_in_context_not_compiled_again():
    """The compile row made for a request stores its chunk in the host tier, and the request waits for
    it; should the host have let it go before the request loads it, waiting again could last for ever.
    The request computes it in context instead."""
    tree = host_tree(host_gb=1e-3)
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, parent.extra_key, rid)
    reader = new_request(*laid_out(request(C1)), rid="r")
    batch, _ = serve_round(tree, reader)
    assert len(batch) == 1 and is_compile_row(batch[0]) and reader.mepic.wait
    tree.tiers.clear_host()  # the host's LRU took it
    batch, _ = serve_round(tree, reader)
    assert batch == [reader] and reader.mepic.compiling == {} and not reader.mepic.wait
    assert reader.mepic.report.chunk_hits == 0 and reader.mepic.report.residency == ["absent"]


def test_a_copy_of_a_chunk_the_pool_keeps_that_finds_no_room_is_absent_not_on_the_device():
    """Without a host tier to take it, the pool's store keeps the compiled chunk, and a reader copies it;
    when the pool has no room for the copy, the chunk is absent for that plan (it is computed)."""
    tree = host_tree(num_pages=12)
    lay = request(C1)
    serve(tree, *compiled(lay.chunks[0]))
    assert len(tree.store) == 1
    running = tree.refs.alloc(tree.pages.available())  # running requests hold every free page
    reader = planned(tree, *laid_out(lay))
    assert reader.mepic.found == ["absent"] and reader.mepic.held == []
    tree.residency.end_round()
    tree.refs.release(running)
    again = planned(tree, *laid_out(lay), rid="again")
    assert again.mepic.found == ["device"] and len(again.mepic.held) == len(C1) // B - 1
    assert not set(again.mepic.held) & set(tree.store.peek(again.mepic.keys[0]))  # a copy, not the store's
    tree.residency.end_round()
