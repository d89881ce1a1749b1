"""cache.readiness on its own: which waiting requests sit a round out, and which storage reads asking starts.

The tree-level behaviour (a reader held back until its compile row has run whole, rows
forgotten after an abort) is in test_radix_chunks; this checks the part with fakes for
what it is handed, so each rule is seen alone."""

from types import SimpleNamespace

from sglang_mepic.cache.compile_rows import CompileRows
from sglang_mepic.cache.readiness import Readiness
from sglang_mepic.tiers.levels import PENDING

PAGE = 4


class FakeTiers:
    """The tiers' lookup as readiness uses it: `want` answers PENDING for the keys being read."""

    def __init__(self, reading=(), prefetch=True):
        self.prefetch = object() if prefetch else None
        self.reading, self.asked = set(reading), []

    def want(self, key, num_slots):
        self.asked.append((key, num_slots))
        return PENDING if key in self.reading else "absent"


def link(*keys, compile=False, pages=3):
    slots = [(i * pages * PAGE, (i + 1) * pages * PAGE) for i in range(len(keys))]
    return SimpleNamespace(compile=compile, keys=list(keys), shape=SimpleNamespace(chunk_slots=slots, keys=list(keys)))


def readiness(rows=None, store=(), tiers=None, shares=True, canonical_from=1):
    return Readiness(rows=rows or CompileRows(PAGE), store=set(store), tiers=tiers or FakeTiers(prefetch=False),
                     shares=shares, keeps=lambda start, end: (end - start) // PAGE > canonical_from,
                     canonical_slots=lambda start, end: end - start - canonical_from * PAGE)


def running(key, pages=None):
    rows = CompileRows(PAGE)
    rows.running[key] = (object(), pages)
    return rows


def test_a_reader_waits_while_its_chunks_compile_row_has_parts_to_run():
    assert readiness(rows=running("a")).must_wait(link("a"))
    assert not readiness(rows=running("b")).must_wait(link("a"))


def test_a_whole_row_in_a_launched_forward_is_read_in_place_where_pages_are_shared():
    rows = running("a", pages=(7, 8))
    assert not readiness(rows=rows, shares=True).must_wait(link("a"))
    assert readiness(rows=rows, shares=False).must_wait(link("a"))  # EPIC, CacheBlend: copied before the forward


def test_a_stored_chunk_never_waits_for_a_row():
    assert not readiness(rows=running("a"), store={"a"}, shares=False).must_wait(link("a"))


def test_a_compile_row_waits_for_no_other_row():
    assert not readiness(rows=running("a")).must_wait(link("a", compile=True))


def test_asking_starts_the_reads_of_missing_kept_chunks_and_waits_while_one_is_pending():
    tiers = FakeTiers(reading={"b"})
    ready = readiness(store={"a"}, tiers=tiers)
    assert ready.must_wait(link("a", "b", "c"))
    # Stored "a" is not asked for; each missing one is, for its canonical slots (3 pages less the first).
    assert tiers.asked == [("b", 2 * PAGE), ("c", 2 * PAGE)]
    tiers.reading.clear()
    assert not ready.must_wait(link("a", "b", "c"))


def test_a_chunk_the_store_would_not_keep_is_never_read():
    tiers = FakeTiers(reading={"a"})
    assert not readiness(tiers=tiers, canonical_from=3).must_wait(link("a", pages=3))  # every page recomputed
    assert tiers.asked == []


def test_no_read_starts_for_a_request_a_compile_row_holds_back_or_without_prefetch():
    tiers = FakeTiers(reading={"b"})
    assert readiness(rows=running("a"), tiers=tiers).must_wait(link("a", "b"))
    assert tiers.asked == []
    off = FakeTiers(reading={"b"}, prefetch=False)
    assert not readiness(tiers=off).must_wait(link("b"))
    assert off.asked == []
