"""A request that waits is matched again at every scheduling round (issue 88: the scheduler's host cost).

Where its chunks are where they were, its plan is the one it had: it is kept, with the positions and the tree
key made of it, rather than made again. Where anything the plan read moved (a chunk stored, evicted, or
stored in other pages), the plan is made again, and the request is matched as a new request with its ids
would be on the same cache: what it reads never depends on the rounds it waited.
"""

import pytest

from support.replay import (B, admit_round, compile_all, evict_all, laid_out, make_tree, new_request, release, replanned,
                            request, serve)

from sglang_mepic.cache import planner
from sglang_mepic.cache.link import Link


@pytest.fixture(scope="module", autouse=True)
def hooks():
    from support.replay import apply_hooks

    apply_hooks()


C1 = tuple(range(100, 140))  # 3 pages, 2 canonical
C2 = tuple(range(200, 250))  # 4 pages, 3 canonical


@pytest.fixture
def plans(monkeypatch):
    """Counts the plans made (planner.plan, as the cache calls it)."""
    made = []
    real = planner.plan

    def counted(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(planner, "plan", counted)
    return made


def matched_as_new(tree, lay):
    """What a request with these ids, seen for the first time, is matched to on the cache as it is now."""
    fresh = replanned(tree, new_request(*laid_out(lay), rid="fresh"))
    out = (fresh.prefix_len, list(fresh.origin_input_ids), fresh.mepic.masked(fresh.full_untruncated_fill_ids).tolist(),
           fresh.mepic.plan.reused if fresh.mepic.plan else ())
    tree.residency.end_round()
    return out


def match_of(req):
    return (req.prefix_len, list(req.origin_input_ids), req.mepic.masked(req.full_untruncated_fill_ids).tolist(),
            req.mepic.plan.reused if req.mepic.plan else ())


def test_a_waiting_request_matched_again_with_its_chunks_where_they_were_keeps_its_plan(plans):
    tree = make_tree()
    lay = request(C1, C2)
    compile_all(tree, lay)
    plans.clear()  # the compile rows' own
    req = replanned(tree, new_request(*laid_out(lay)))
    first, key = req.mepic.planned, match_of(req)
    assert first.reuses and len(plans) == 1
    for _ in range(3):  # rounds in which it was not admitted
        tree.residency.end_round()
        replanned(tree, req)
    assert len(plans) == 1 and req.mepic.planned is first
    assert match_of(req) == key
    held = list(req.mepic.held)
    tree.residency.end_round()
    assert sorted(held) == sorted(p for k in req.mepic.keys for p in tree.store.peek(k))  # it held its chunks
    assert matched_as_new(tree, lay) == key


def test_a_waiting_request_is_planned_again_when_its_chunks_were_stored_or_evicted_meanwhile(plans):
    tree = make_tree()
    lay = request(C1, C2)
    compile_all(tree, request(C1))  # C2 is computed in context at first
    plans.clear()
    req = replanned(tree, new_request(*laid_out(lay)))
    assert req.mepic.plan.hits == 1
    tree.residency.end_round()

    compile_all(tree, request(C2))  # stored while it waited
    plans.clear()
    replanned(tree, req)
    assert len(plans) == 1 and req.mepic.plan.hits == 2
    now = match_of(req)
    tree.residency.end_round()
    assert now == matched_as_new(tree, lay)

    evict_all(tree)  # both gone while it waited
    replanned(tree, req)
    assert req.mepic.plan.hits == 0 and not req.mepic.planned.reuses
    now = match_of(req)
    tree.residency.end_round()
    assert now == matched_as_new(tree, lay)

    compile_all(tree, lay)  # stored again, in other pages than before
    replanned(tree, req)
    now = match_of(req)
    tree.residency.end_round()
    assert req.mepic.plan.hits == 2 and now == matched_as_new(tree, lay)


def test_the_key_kept_for_a_rematch_follows_the_ids_asked(plans):
    """The last key is kept for the same ids of the same plan; other ids (the output so far of a request
    retracted to the queue, a list where it was an array) get their own."""
    from array import array

    tree = make_tree()
    lay = request(C1, C2)
    compile_all(tree, lay)
    req = replanned(tree, new_request(*laid_out(lay)))
    link = req.mepic
    ids = req.full_untruncated_fill_ids
    key = link.masked(ids)
    key[0] = 12345  # a caller's change to the key it was given is not kept
    assert link.masked(ids) != key
    longer = array("q", ids) + array("q", [7, 8])
    assert link.masked(longer).tolist() == link.masked(ids).tolist() + [7, 8]
    assert link.masked(list(ids)).tolist() == link.masked(ids).tolist()
    ids_changed = array("q", ids)
    ids_changed[-1] = 4242
    assert link.masked(ids_changed)[-1] == 4242
    tree.residency.end_round()
    serve(tree, *laid_out(lay))


def retracted_reader_planned_again_on_placeholders():
    """A reader of two chunks no tier holds is admitted with its compile rows and pointed at their pages; it is
    retracted, its chunks stored then evicted while it waits, and it is matched again on placeholders, as in its
    first plan (found by the review of 49de630). Returns what it was matched to, its rows, and whether its plan
    was kept."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree = make_tree()
    tree.compile_rows.make_req = lambda rid, ids, parent: new_request(list(ids), None, parent.extra_key, rid)
    reader = new_request(*laid_out(request(tuple(range(100, 161)), tuple(range(200, 261)))), rid="reader")
    batch = admit_round(tree, [reader])  # its compile rows and it, pointed at the rows' pages
    first = reader.mepic.planned
    for row in batch[:-1]:
        release(tree, row)  # the compile rows end: the chunks are stored
    release(tree, reader, cache=False)  # retracted: its row let go, nothing cached
    reader.output_ids.extend([11, 12])
    reader.kv.req_pool_idx = None
    tree.evict(EvictParams(num_tokens=96 * B))
    assert len(tree.store) == 0
    replanned(tree, reader)
    link = reader.mepic
    matched = (reader.prefix_len, list(reader.origin_input_ids), link.injected.tolist(),
               link.planned.reused_slots.tolist())
    kept = link.planned is first
    tree.residency.end_round()
    tree.compile_rows.end_round()
    batch = admit_round(tree, [reader])
    rows = [tree.req_to_token_pool.req_to_token[r.kv.req_pool_idx, :len(r.origin_input_ids)].tolist() for r in batch]
    for r in batch:
        release(tree, r)
    return matched, rows, kept


def test_a_kept_plan_is_not_changed_by_pointing_its_reader_at_its_compile_rows(monkeypatch):
    """Pointing a reader at its compile rows' pages writes into its injected prefix. On a CPU pool that was a view
    of the plan's reused slots, and a kept plan then named the first compile rows' (freed) slots at the next
    match: it must match as a plan made anew does."""
    kept_matched, kept_rows, kept = retracted_reader_planned_again_on_placeholders()
    assert kept
    monkeypatch.setattr(Link, "reuse_plan", lambda self, made_from: None)
    fresh_matched, fresh_rows, _ = retracted_reader_planned_again_on_placeholders()
    assert kept_matched == fresh_matched
    assert kept_rows == fresh_rows
