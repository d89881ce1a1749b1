"""cache.residency's custody of a planned request's pins, on its own: who lets go of them, and when.

The tree-level behaviour (pins taken at the match, let go by a request the round did not admit,
the memory check that follows) is in test_radix_chunks and test_collisions; this checks the
custody rules with a fake for the page references, so each is seen alone."""

from collections import Counter
from types import SimpleNamespace

from sglang_mepic.cache.link import Link, Phase
from sglang_mepic.cache.residency import Found, Residency


class FakeRefs:
    def __init__(self):
        self.released = Counter()

    def release(self, pages):
        self.released.update(pages)


def residency():
    return Residency(store=None, refs=FakeRefs(), pages=None, tiers=None, evict=None, page_size=4,
                     canonical_from=1)


def planned(res, pins, where=("device",)):
    link = Link(shape=SimpleNamespace())
    res.hold(link, Found(resident={}, where=list(where), pins=list(pins)))
    link.set_planned(object())
    return link


def test_a_request_planned_again_holds_the_new_plans_pins_instead_of_the_earlier_ones():
    res = residency()
    link = planned(res, [1, 2])
    res.hold(link, Found(resident={}, where=["device"], pins=[3]))
    assert res.refs.released == Counter({1: 1, 2: 1}) and link.held == [3] and link.phase is Phase.LINKED


def test_the_round_end_lets_go_of_what_a_request_it_did_not_admit_holds():
    res = residency()
    link = planned(res, [1, 2])
    res.end_round()
    assert res.refs.released == Counter({1: 1, 2: 1}) and link.held == [] and link.phase is Phase.LINKED
    res.end_round()  # nothing twice
    assert res.refs.released == Counter({1: 1, 2: 1})


def test_an_admitted_request_keeps_its_pins_past_the_round_end_until_its_release():
    res = residency()
    admitted, waiting = planned(res, [1, 2]), planned(res, [2, 3])
    admitted.admit()
    res.end_round()
    assert res.refs.released == Counter({2: 1, 3: 1}) and admitted.held == [1, 2]
    assert admitted.admitted and waiting.phase is Phase.LINKED
    res.end_round()  # custody ended at the first round end: a later one leaves it alone
    assert admitted.held == [1, 2]
    res.let_go(admitted)  # its release
    assert res.refs.released == Counter({1: 1, 2: 2, 3: 1}) and admitted.held == []


def test_a_request_that_found_nothing_is_not_kept_and_where_it_looked_is_recorded():
    res = residency()
    link = planned(res, [], where=["absent"])
    res.end_round()
    assert not res.refs.released and link.found == ["absent"] and link.phase is Phase.PLANNED


def test_a_reset_forgets_the_pins_without_releasing_them():
    res = residency()  # the pool is cleared right after (flush_cache): releasing would double-count
    link = planned(res, [1])
    res.reset()
    res.end_round()
    assert not res.refs.released and link.held == []
