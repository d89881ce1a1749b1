"""A request never reads KV that was computed for something else: a property test on the
real mepic radix cache (tests/support/replay.py), over layouts drawn to collide.

Every KV slot a replayed request computes is stamped, in the KV pool itself, with a
signature of what that slot is: its token, its RoPE position and (recursively) the
signatures of every slot it attends to, in natural order. A slot of a reused canonical
page is what the chunk's standalone compile computed there. Stamps live in the pool's
bytes, so they travel with every copy (host tier, EPIC's private copies) like real KV.

When a request is admitted, every slot of its prefix (matched in the tree, or
injected from the chunk store) must carry exactly the signature the request would
compute there itself. A tree key that two different requests share (defect 1 of
issue 29: the same chunk and the same computed pages in another arrangement) shows up
as a prefix slot whose stamp differs.

Layouts collide by construction: prompts are made of the same pages as the chunks, and
chunks are prefixes, suffixes, repeats and concatenations of one another.
"""

import hashlib
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.replay import (B, allocate, apply_hooks, compiled, laid_out, make_tree, new_request, planned, prepare_batch,
                            release, replanned)
from sglang_mepic.wire.layout import NO_POSITION, Kind, Piece, Placement, layout

EXAMPLES = int(os.environ.get("PROVENANCE_EXAMPLES", 150))
NUM_PAGES = 64


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


def h(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "big")


def stamp(value: int) -> torch.Tensor:
    """A 64-bit signature as four float32s, each exact (16 bits < 2**24)."""
    return torch.tensor([(value >> s) & 0xFFFF for s in (0, 16, 32, 48)], dtype=torch.float32)


def unstamp(row: torch.Tensor) -> int:
    return sum(int(v) << s for v, s in zip(row.tolist(), (0, 16, 32, 48)))


def signatures(tokens, positions, canonical: dict[int, int]) -> list[int]:
    """Signature of each natural slot: canonical[s] where the slot's KV is reused from a chunk's
    compile, else its token and position in the context of every visible slot before it."""
    out, context = [], 0
    for s, (t, p) in enumerate(zip(tokens, positions)):
        if p == NO_POSITION:
            out.append(h("pad"))
            continue
        sig = canonical[s] if s in canonical else h("computed", t, p, context)
        out.append(sig)
        context = h(context, sig)
    return out


def standalone(seg) -> list[int]:
    """Signatures of a chunk's slots as its compile computes them (the chunk alone)."""
    ids, lay = compiled(seg)
    positions = _positions(len(ids), lay.pads)
    sigs = signatures(ids, positions, {})
    start = lay.chunk[0]
    return sigs[start:start + seg.size]


def _positions(size, pads):
    from sglang_mepic.wire.slots import slot_positions

    return slot_positions(size, [tuple(p) for p in pads]).tolist()


def expected(req, segments) -> list[int]:
    """What each natural slot of a planned request must hold, given its own plan."""
    link = req.mepic
    positions = link.natural_positions(link.size).tolist()
    canonical = {}
    if link.plan is not None and link.plan.reused:
        reused_pages = set(link.plan.order[:len(link.plan.reused)])
        for (start, end), seg in zip(link.chunk_slots, segments):
            sigs = standalone(seg)
            for s in range(start, end):
                if s // B in reused_pages:
                    canonical[s] = sigs[s - start]
    return signatures(list(link.natural), positions, canonical)


def serve_checked(tree, ids, hints, segments, log):
    """Plan, admit and allocate a request; check its prefix's stamps; stamp what it computes."""
    req = planned(tree, ids, hints)
    req.lock = tree.lock(req.last_node)
    tree.admission.admit(req)
    allocate(tree, req)
    check_and_stamp(tree, req, segments, log)
    release(tree, req)


def serve_batch_checked(tree, ids, hints, segments, log):
    """A request as the scheduler serves it: in one batch with the compile rows of its chunks that
    no tier holds (compile_rows.py), each row checked and stamped in batch order, as a forward
    writes every row's KV before any row reads it; in EPIC, the compile rows in a round of their
    own and the request in the next."""
    tree.compile_rows.make_req = lambda rid, row_ids, parent: new_request(list(row_ids), None, parent.extra_key, rid)
    req = new_request(ids, hints)
    while True:
        replanned(tree, req)
        rows = []
        for key, row in req.mepic.compiling.items():
            if not any(r is row for r, _ in rows):
                rows.append((row, segments[req.mepic.keys.index(key)]))
            req.mepic.made_for.add(key)
        batch = [r for r, _ in rows] + ([] if req.mepic.wait else [req])
        for r, _ in rows:
            replanned(tree, r)
        prepare_batch(tree, batch)
        for r, seg in rows:
            check_and_stamp(tree, r, [seg], log)
        if not req.mepic.wait:
            check_and_stamp(tree, req, segments, log)
        for r in batch:
            release(tree, r)
        if req in batch:
            return


def check_and_stamp(tree, req, segments, log):
    """An allocated request: every slot of its prefix must carry what it would compute there; then
    what it computes is stamped."""
    link = req.mepic
    want = expected(req, segments) if link is not None else None
    size = len(req.origin_input_ids)
    row = tree.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :size].to(torch.int64)
    k = tree.kv_pool.k_buffer[0].view(tree.kv_pool.k_buffer[0].shape[0], -1)
    order = link.order if link is not None and link.order is not None else list(range(size))
    positions = link.natural_positions(size).tolist() if link is not None else list(range(size))
    for i in range(size):
        natural = order[i]
        if want is None:
            continue
        if i < req.prefix_len:
            if positions[natural] == NO_POSITION:
                continue  # a pad is never read
            got = unstamp(k[row[i], :4])
            assert got == want[natural], (
                f"request {len(log)} reads slot {natural} (planned {i}, position {positions[natural]}) "
                f"from KV computed for something else\nrequests so far: {log}")
        else:
            k[row[i], :4] = stamp(want[natural])


def pieces_of(data, pages, chunks):
    pieces = []
    for _ in range(data.draw(st.integers(1, 3), label="pieces")):
        kind = data.draw(st.sampled_from(["chunk", "chunk", "chunk pages", "pages"]), label="piece")
        if kind == "chunk":
            pieces.append(Piece(Kind.CHUNK, tuple(data.draw(st.sampled_from(chunks), label="chunk"))))
            continue
        if kind == "chunk pages":  # a prompt made of a chunk's leading pages: the same tokens, another role
            chunk = data.draw(st.sampled_from(chunks), label="of chunk")
            body = chunk[:data.draw(st.integers(1, max(1, len(chunk) // B)), label="pages of it") * B]
        else:
            body = [t for p in data.draw(st.lists(st.sampled_from(pages), max_size=2), label="prompt pages") for t in p]
        body = list(body) + list(data.draw(st.sampled_from(TAILS), label="prompt tail"))
        if body:
            pieces.append(Piece(Kind.PROMPT, tuple(body)))
    pieces.append(Piece(Kind.PROMPT, data.draw(st.sampled_from(QUESTIONS), label="question")))
    return pieces


# Few distinct tails and questions, so that different arrangements end alike.
TAILS = ((), (), (), (11,), (12, 10, 11))
QUESTIONS = ((12, 11, 10), (10, 10, 12, 11, 11))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), mode=st.sampled_from(["mepic", "naive", "epic-16"]), host_tier=st.booleans())
def test_no_request_reads_kv_computed_for_something_else(data, mode, host_tier):
    tree = make_tree(mode, canonical_from={"mepic": 1, "naive": 0, "epic-16": 0}[mode],
                     host_gb=1e-3 if host_tier else 0.0, num_pages=NUM_PAGES)
    # Pages that prompts and chunks are both made of: equal pages in different roles.
    pages = [data.draw(st.lists(st.integers(10, 12), min_size=B, max_size=B), label=f"page {i}") for i in range(3)]
    chunks = []
    for i in range(3):
        picks = data.draw(st.lists(st.sampled_from(pages), min_size=1, max_size=3), label=f"chunk {i} pages")
        tail = data.draw(st.lists(st.integers(10, 12), max_size=B), label=f"chunk {i} tail")
        chunks.append([t for p in picks for t in p] + tail)
    log, pieces = [], None
    for _ in range(data.draw(st.integers(2, 6), label="requests")):
        if pieces is not None and len(pieces) > 2 and data.draw(st.booleans(), label="rearrange the last"):
            # The same pieces in another order: equal computed pages, other contexts.
            body = data.draw(st.permutations(pieces[:-1]), label="order")
            pieces = list(body) + [pieces[-1]]
        else:
            pieces = pieces_of(data, pages, chunks)
        lay = layout(pieces, B, Placement.TRAILING)
        log.append([(p.kind.value, len(p.tokens)) for p in pieces])
        if data.draw(st.integers(0, 3), label="compile first (if 0)") == 0:
            for seg in lay.chunks:  # stored before (an earlier batch's compile rows)
                serve_checked(tree, *compiled(seg), [seg], log)
        serve_batch_checked(tree, *laid_out(lay), lay.chunks, log)
        if data.draw(st.integers(0, 3), label="evict (if 0)") == 0:
            from sglang.srt.mem_cache.base_prefix_cache import EvictParams

            tree.evict(EvictParams(num_tokens=data.draw(st.integers(1, NUM_PAGES), label="evict pages") * B))


def test_the_reported_collision():
    """Issue 29's shape: page A, page B, chunk C = A+B. X = [C][A + question] and X' = [A][C][question]."""
    a, b = [10 + i % 3 for i in range(B)], [11 + i % 2 for i in range(B)]
    c, q = a + b, [12, 11, 10]
    tree = make_tree("mepic")
    x = layout([Piece(Kind.CHUNK, tuple(c)), Piece(Kind.PROMPT, tuple(a + q))], B, Placement.TRAILING)
    x2 = layout([Piece(Kind.PROMPT, tuple(a)), Piece(Kind.CHUNK, tuple(c)), Piece(Kind.PROMPT, tuple(q))], B,
                Placement.TRAILING)
    log = ["X", "X'"]
    for lay in (x, x2):
        for seg in lay.chunks:
            serve_checked(tree, *compiled(seg), [seg], log)
        serve_checked(tree, *laid_out(lay), lay.chunks, log)
