"""The page anatomy (sglang_mepic/pages/anatomy.py): every used page in exactly one category."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mepic.pages.anatomy import CATEGORIES, count

T = lambda *pages: torch.tensor(pages, dtype=torch.int64)  # noqa: E731


def test_each_page_goes_to_the_first_category_that_claims_it():
    used = T(*range(1, 15))
    reads = [T(1, 2, 3, 4, 5), T(2, 3, 6), T(3, 7), T(3), T(3)]  # page 3: 5 readers, page 2: 2
    compile_pages = [T(8, 9)]
    chunks = T(1, 2, 3, 10, 11, 9)  # 9 is a compile row's page too: the compile row claims it
    evictable = T(11, 12)
    got = count(used, reads, compile_pages, chunks, evictable, num_pages=16)
    assert got == {"compile_rows": 2,  # 8, 9
                   "chunk_read_1": 1, "chunk_read_2_4": 1, "chunk_read_5_plus": 1,  # 1, 2, 3
                   "chunk_pinned": 1, "chunk_evictable": 1,  # 10 held for a request not admitted, 11 evictable
                   "private": 4, "shared_prefix": 0,  # 4, 5, 6, 7: one reader each
                   "prefix_evictable": 1, "held_unread": 2}  # 12 evictable; 13, 14 held


def test_a_page_a_request_reads_twice_is_one_reader():
    got = count(T(1, 2), [T(1, 1, 2), T(2)], [], T(), None, num_pages=3)
    assert got["private"] == 1 and got["shared_prefix"] == 1


def test_without_a_ledger_every_unread_page_is_the_trees_to_evict():
    got = count(T(1, 2, 3), [T(1)], [], T(), None, num_pages=4)
    assert got["prefix_evictable"] == 2 and got["held_unread"] == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 64).flatmap(lambda n: st.tuples(
    st.just(n), st.sets(st.integers(1, n - 1)), st.lists(st.lists(st.integers(1, n - 1)), max_size=8),
    st.lists(st.lists(st.integers(1, n - 1), min_size=1), max_size=3), st.sets(st.integers(1, n - 1)),
    st.one_of(st.none(), st.sets(st.integers(1, n - 1))))))
def test_the_categories_partition_the_used_pages(case):
    n, used, reads, compiles, chunks, evictable = case
    got = count(T(*sorted(used)), [T(*r) for r in reads], [T(*c) for c in compiles], T(*sorted(chunks)),
                None if evictable is None else T(*sorted(evictable)), num_pages=n)
    assert set(got) == set(CATEGORIES)
    assert sum(got.values()) == len(used)
    compiling = {p for c in compiles for p in c} & used
    assert got["compile_rows"] == len(compiling)
    read = {p for r in reads for p in r}
    chunk_used = (chunks & used) - compiling
    assert got["chunk_read_1"] + got["chunk_read_2_4"] + got["chunk_read_5_plus"] == len(chunk_used & read)
    assert got["private"] + got["shared_prefix"] == len((used - compiling - chunks) & read)
