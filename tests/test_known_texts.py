"""Registered texts found in plain prompts by content (frontend/known_texts.py)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mepic.frontend.known_texts import (ANCHOR, IndexFull, KnownTextError, KnownTexts, anchor_of, text_bytes,
                                               window_hashes)

WORDS = "river stone cloud harbor lantern meadow copper violet summit ember orchard falcon quartz".split()


def doc(seed: int, words: int = 40) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + f" #{seed}"


def test_window_hashes_agree_with_the_anchor_of_each_window():
    text = doc(1, 80) + " é漢字🙂 " + doc(2, 30)
    hashes = window_hashes(text)
    assert len(hashes) == len(text) - ANCHOR + 1
    for i in (0, 1, 17, len(text) // 2, len(text) - ANCHOR):
        assert int(hashes[i]) == anchor_of(text[i:])


def test_a_known_text_is_found_at_any_offset_and_only_where_it_is_whole():
    known = KnownTexts(1 << 20)
    a, b = doc(1), doc(2)
    known.add("ns", a)
    known.add("ns", b)
    prompt = "Answer from the documents.\n" + b + "\n\n" + a + "\nQuestion: why?"
    spans = known.find("ns", prompt)
    assert [prompt[s:e] for s, e in spans] == [b, a]
    # Same first characters, another ending: verified, not found.
    assert known.find("ns", "x" + a[:-3] + "!!!" + " tail") == []
    assert known.find("ns", a[:ANCHOR]) == []


def test_overlaps_take_the_leftmost_then_the_longest_and_never_nest():
    known = KnownTexts(1 << 20)
    outer = doc(3, 60)
    inner = outer[: len(outer) // 2]  # the same start, shorter
    later = outer[len(outer) // 3:]   # starts inside outer
    for t in (inner, later, outer):
        known.add("ns", t)
    prompt = "Q " + outer + " end"
    assert known.find("ns", prompt) == [(2, 2 + len(outer))]
    # Without the outer text the inner one is found first, and the overlapping later one is not.
    fresh = KnownTexts(1 << 20)
    fresh.add("ns", inner)
    fresh.add("ns", later)
    assert fresh.find("ns", prompt) == [(2, 2 + len(inner))]


def test_namespaces_never_see_each_others_texts():
    known = KnownTexts(1 << 20)
    a = doc(4)
    known.add(("tenant-a", None, None), a)
    assert known.find(("tenant-b", None, None), "x " + a) == []
    assert known.find(("tenant-a", None, None), "x " + a) == [(2, 2 + len(a))]
    assert known.size(("tenant-b", None, None)) == 0


def test_the_index_stays_within_its_budget_under_a_stream_of_unique_texts():
    budget = 40_000
    known = KnownTexts(budget)
    for i in range(2_000):
        known.add("ns", doc(100 + i))
        assert known.used <= budget
    space = known.spaces["ns"]
    assert len(space.texts) < 2_000
    index = known.index
    assert len(index.recent) + int(index.main.alive.sum()) == len(space.texts)  # the index holds what is known
    newest = doc(100 + 1_999)
    assert known.find("ns", newest) == [(0, len(newest))]
    assert known.find("ns", doc(100)) == []  # the oldest was dropped


def test_a_namespace_never_pushes_out_another_namespaces_texts():
    known = KnownTexts(40_000)
    a = [doc(500 + i, 60) for i in range(60)]
    while known.used + text_bytes(a[-1]) < 30_000:
        known.add("a", a.pop())
    held = known.size("a")
    with pytest.raises(IndexFull):
        known.add_all("b", [doc(900, 400), doc(901, 400), doc(902, 400)])
    assert known.size("a") == held and known.size("b") == 0  # all or none
    assert known.add("b", doc(903, 20)) and known.used <= 40_000
    # A namespace's own new texts push out its own old ones.
    for i in range(30):
        known.add("b", doc(1000 + i, 20))
    assert known.size("a") == held and known.used <= 40_000 and known.size("b") < 31


def test_bad_registrations_are_refused():
    known = KnownTexts(1_000)
    for bad in ("", "short", "x" * (ANCHOR - 1), "y" * 1_001, None, 5):
        with pytest.raises(KnownTextError):
            known.add("ns", bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=6, unique=True), st.data())
def test_every_inserted_text_is_found_exactly_where_it_was_put(seeds, data):
    known = KnownTexts(1 << 22)
    texts = [doc(s, data.draw(st.integers(12, 60))) for s in seeds]
    for t in texts:
        known.add("ns", t)
    order = data.draw(st.permutations(range(len(texts))))
    filler = data.draw(st.lists(st.text(alphabet="xyz \n?", max_size=30), min_size=len(texts) + 1,
                                max_size=len(texts) + 1))
    prompt, expected = filler[0], []
    for i, j in enumerate(order):
        expected.append((len(prompt), len(prompt) + len(texts[j])))
        prompt += texts[j] + filler[i + 1]
    assert known.find("ns", prompt) == expected


def test_what_a_reviewer_tried_stays_cheap_and_correct():
    """Found by review (2026-11-28): a lone surrogate (a valid JSON escape) raised in the hash and left a
    text half-registered; texts sharing one start made every window of a repeating prompt a candidate."""
    from sglang_mepic.frontend.known_texts import MAX_SAME_START, namespace_of

    known = KnownTexts(1 << 24)
    odd = "\ud800" * 70
    known.add("s", odd)
    assert known.find("s", "q" + odd) == [(1, 71)] and known.size("s") == 1
    same = ["A" * 200 + str(i) for i in range(MAX_SAME_START)]
    known.add_all("n", same)
    with pytest.raises(KnownTextError, match="same 64 characters"):
        known.add("n", "A" * 300)
    assert known.size("n") == MAX_SAME_START
    assert known.find("n", "A" * 100_000) == []  # every window starts like them; none is whole
    assert known.find("n", "zz" + same[3] + "!") == [(2, 2 + len(same[3]))]
    with pytest.raises(IndexFull) as full:
        KnownTexts(1_000).add_all("x", [doc(1, 200)])
    assert not any(ch.isdigit() for ch in str(full.value).split("bytes", 1)[1])  # says nothing of others
    assert namespace_of("", "") == namespace_of(None, None) == (None, None)
