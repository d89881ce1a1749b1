from sglang_mepic.plan import Source, make_plan
from sglang_mepic.segments import Kind, Piece, layout

B = 4


def pieces():
    return [Piece(Kind.PROMPT, (1, 2, 3)), Piece(Kind.CHUNK, tuple(range(10, 21))),  # 11 tokens: 3 pages
            Piece(Kind.PROMPT, (5, 6))]


def sources(plan):
    return [p.source for p in plan.pages]


def test_new_chunk_is_compiled_and_first_block_computed():
    lay = layout(pieces(), B)
    plan = make_plan(lay, {1: "c"}, prefix_len=0, resident={})
    assert sources(plan) == [Source.COMPUTE, Source.COMPUTE, Source.COMPILE, Source.COMPILE, Source.COMPUTE]
    assert plan.compile == (("c", 1),)
    assert plan.new_pages == 5
    # prompt (3 real), chunk first block (4 real), question (2 real)
    assert plan.compute_slots() == [0, 1, 2, 4, 5, 6, 7, 16, 17]


def test_resident_chunk_reuses_canonical_pages():
    lay = layout(pieces(), B)
    plan = make_plan(lay, {1: "c"}, prefix_len=0, resident={"c": (70, 71)})
    assert sources(plan) == [Source.COMPUTE, Source.COMPUTE, Source.SHARED, Source.SHARED, Source.COMPUTE]
    assert [p.page for p in plan.pages if p.source is Source.SHARED] == [70, 71]
    assert plan.compile == ()
    assert plan.new_pages == 3


def test_prefix_hit_covers_first_block():
    lay = layout(pieces(), B)
    plan = make_plan(lay, {1: "c"}, prefix_len=2 * B, resident={"c": (70, 71)})
    assert sources(plan) == [Source.PREFIX, Source.PREFIX, Source.SHARED, Source.SHARED, Source.COMPUTE]
    assert plan.compute_slots() == [16, 17]


def test_recompute_all_blocks_shares_nothing():
    lay = layout(pieces(), B)
    plan = make_plan(lay, {1: "c"}, prefix_len=0, resident={"c": (70, 71)}, recompute_blocks=None)
    assert set(sources(plan)) == {Source.COMPUTE}
    assert plan.compile == ()
    assert len(plan.compute_slots()) == 3 + 11 + 2


def test_positions_skip_pads():
    plan = make_plan(layout(pieces(), B), {1: "c"}, prefix_len=0, resident={})
    assert plan.positions[:8] == (0, 1, 2, -1, 3, 4, 5, 6)
