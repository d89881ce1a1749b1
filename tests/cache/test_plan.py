import pytest

from sglang_mepic.cache.plan import ChunkSpan, make_plan, sources
from sglang_mepic.wire.layout import NO_POSITION, Kind, Piece, layout

B = 4


def planned(values, plan) -> list:
    """`values` (one per natural slot) in planned order; values past the prompt (output tokens) stay last."""
    return [values[s] for s in plan.slot_order().tolist()] + list(values[plan.size:])


def request():
    """[prompt 3 + 1 pad][chunk c: 11 tokens + 1 pad = 3 pages][prompt 2][chunk d: 8 = 2 pages][question 2]."""
    return layout([Piece(Kind.PROMPT, (1, 2, 3)), Piece(Kind.CHUNK, tuple(range(10, 21))),
                   Piece(Kind.PROMPT, (5, 6)), Piece(Kind.CHUNK, tuple(range(30, 38))),
                   Piece(Kind.PROMPT, (7, 8))], B)


def spans(lay, keys=("c", "d")):
    return [ChunkSpan(s.start, s.end, k) for s, k in zip(lay.chunks, keys)]


def test_reused_pages_come_first_and_computed_pages_keep_request_order():
    lay = request()
    plan = make_plan(lay.size, B, spans(lay), {"c": (70, 71), "d": (80,)}, canonical_from=1)
    # natural pages: 0 prompt, 1-3 chunk c, 4 prompt, 5-6 chunk d, 7 question
    assert plan.order == (2, 3, 6, 0, 1, 4, 5, 7)
    assert plan.reused == (70, 71, 80)
    assert plan.prefix_slots == 3 * B
    assert (plan.hits, plan.misses) == (2, 0)
    assert plan.reused_slots()[:B + 1].tolist() == [280, 281, 282, 283, 284]


def test_computed_positions_ascend_so_chunked_prefill_sees_its_context_first():
    lay = request()
    plan = make_plan(lay.size, B, spans(lay), {"c": (70, 71), "d": (80,)}, canonical_from=1)
    pos = planned(lay.slot_positions(), plan)
    computed = [p for p in pos[plan.prefix_slots:] if p != NO_POSITION]
    assert computed == sorted(computed)
    assert sorted(p for p in pos if p != NO_POSITION) == list(range(len(lay.real_tokens())))


def test_missing_chunk_is_computed_whole_in_place():
    lay = request()
    plan = make_plan(lay.size, B, spans(lay), {"d": (80,)}, canonical_from=1)
    assert plan.order == (6, 0, 1, 2, 3, 4, 5, 7)
    assert (plan.hits, plan.misses) == (1, 1)


def test_naive_reuses_every_chunk_page_and_all_reuses_nothing():
    lay = request()
    naive = make_plan(lay.size, B, spans(lay), {"c": (70, 71, 72), "d": (80, 81)}, canonical_from=0)
    assert naive.order[:5] == (1, 2, 3, 5, 6) and naive.reused == (70, 71, 72, 80, 81)
    full = make_plan(lay.size, B, spans(lay), {"c": (70, 71), "d": (80,)}, canonical_from=None)
    assert full.order == tuple(range(8)) and full.reused == ()


def test_planned_keeps_output_slots_last():
    lay = request()
    plan = make_plan(lay.size, B, spans(lay), {"c": (70, 71), "d": (80,)}, canonical_from=1)
    ids = lay.slot_tokens() + [99, 98]
    out = planned(ids, plan)
    assert out[-2:] == [99, 98] and sorted(out) == sorted(ids)


def test_wrong_canonical_page_count_is_a_bug_not_a_silent_mix():
    lay = request()
    with pytest.raises(ValueError, match="canonical pages"):
        make_plan(lay.size, B, spans(lay), {"c": (70,)}, canonical_from=1)


def test_private_copy_sources_skip_pads_and_the_first_k_tokens():
    lay = request()
    pos = lay.slot_positions()
    src, hits, misses = sources(lay.size, B, spans(lay), {"c": (70, 71, 72)}, pos, keep_tokens=5)
    c = lay.chunks[0]
    chunk_src = src[c.start:c.end]
    assert chunk_src[:5] == [-1] * 5                      # recomputed: first 5 real tokens
    assert chunk_src[5] == 71 * B + 1 and chunk_src[10] == 72 * B + 2
    assert chunk_src[11] == -1                             # the trailing pad
    assert all(s == -1 for s in src[:c.start] + src[c.end:])  # prompts, and chunk d (a miss)
    assert (hits, misses) == (1, 1)


def test_modes_parse_and_say_what_they_keep():
    from sglang_mepic import config, modes

    assert modes.parse_mode("epic-16") == modes.Mode(modes.Kind.EPIC, tokens=16)
    assert modes.parse_mode("cacheblend-0.15").ratio == 0.15
    assert modes.parse_mode("mepic").shares and modes.parse_mode("naive").shares
    assert not modes.parse_mode("epic-8").shares and not modes.parse_mode("full").reuses
    assert config.parse_recompute_blocks("all") is None and config.parse_recompute_blocks("2") == 2
    for bad in ("epic-0", "epic", "cacheblend-1.5", "fast"):
        with pytest.raises(ValueError, match="choose one of"):
            modes.parse_mode(bad)


def test_chunks_past_the_logprob_start_are_computed_and_later_pages_keep_their_places():
    lay = request()
    d = lay.chunks[1]
    plan = make_plan(lay.size, B, spans(lay), {"c": (70, 71), "d": (80,)}, canonical_from=1, reuse_before=d.start + 1)
    assert plan.order == (2, 3, 0, 1, 4, 5, 6, 7) and plan.reused == (70, 71)  # d is a hit, computed
    assert (plan.hits, plan.misses) == (2, 0)
    assert plan.slot_order()[d.start:].tolist() == list(range(d.start, lay.size))
    src, hits, _ = sources(lay.size, B, spans(lay), {"c": (70, 71, 72), "d": (80, 81)}, lay.slot_positions(),
                           keep_tokens=0, reuse_before=d.start)
    assert all(s == -1 for s in src[d.start:]) and src[lay.chunks[0].start] == 70 * B and hits == 2
