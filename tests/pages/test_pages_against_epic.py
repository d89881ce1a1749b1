"""MEPIC never holds more pages than EPIC for the same requests in flight (issue 71).

EPIC keeps a private copy of each chunk a request reads; MEPIC shares one copy and recomputes only
each chunk's first block. Both lay chunks out alike (padded to whole pages), so for any set of
running requests MEPIC's pages are at most EPIC's: equal when no chunk is read twice, fewer as soon
as one is. A fixed trace is replayed through the scheduler's cache calls (tests/support/replay.py,
no server, no model) in both modes, at several pool sizes, in waves: each wave's requests are
planned, their compile rows run, and they are admitted round after round (EPIC's readers wait a
round for their chunks to be stored) until all of them run; then they end.

"Held" is what the pool cannot give back: used pages less those the cache could evict. While a
wave's requests run, MEPIC's held pages must not exceed EPIC's. In the round that compiles a chunk
MEPIC's reader runs beside the compile row (EPIC's waits a round), so for that round only two pages
per chunk compiled exist on top: the chunk's first page, in the row and in each reader's recomputed
first block, and the row's trailing slot (the token SGLang samples from, one slot past the chunk's
last page: a page of its own). The prefill peak may exceed EPIC's by that much, no more.
"""

import random

import pytest

from sglang_mepic.cache.compile_rows import is_compile_row
from support.replay import B, admit_round, apply_hooks, laid_out, make_tree, new_request, release, request

WAVES = (1, 2, 4, 8, 1, 4, 8, 2, 8)  # requests in flight together, in trace order
DOCS = 8


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


def trace(seed: int = 71) -> list[list[tuple]]:
    """Waves of laid-out requests: 1-4 of 8 documents each, in any order, beside their own prompt and
    question; the documents recur across and within waves (some never do), at other positions."""
    rng = random.Random(seed)
    docs = [tuple(rng.randrange(10, 4000) for _ in range(rng.randint(20, 120))) for _ in range(DOCS)]
    waves = []
    for size in WAVES:
        wave = []
        for _ in range(size):
            picked = rng.sample(docs, rng.randint(1, 4))
            prompt = tuple(rng.randrange(10, 4000) for _ in range(rng.randint(1, 30)))
            question = tuple(rng.randrange(10, 4000) for _ in range(rng.randint(1, 30)))
            wave.append(request(*picked, prompt=prompt, question=question))
        waves.append(wave)
    return waves


def held(tree, free_when_empty: int) -> int:
    return free_when_empty - tree.pages.available() - tree.evictable_size() // B


def run_wave(tree, layouts, free_when_empty: int) -> tuple[int, int, int]:
    """(the prefill rounds' peak of held pages, held pages once every request of the wave runs, chunks
    compiled); every request then ends."""
    pending = [new_request(*laid_out(lay), rid=f"r{i}") for i, lay in enumerate(layouts)]
    running, peak, compiled = [], 0, 0
    for _ in range(3):  # EPIC's readers wait one round for their chunks
        if not pending:
            break
        batch = admit_round(tree, pending)
        peak = max(peak, held(tree, free_when_empty))
        for req in batch:  # a compile row ends with its prefill; a reader goes on decoding
            if is_compile_row(req):
                compiled += 1
                release(tree, req)
            else:
                running.append(req)
        pending = [r for r in pending if not any(r is b for b in batch)]
    assert not pending, "a request was never admitted"
    steady = held(tree, free_when_empty)
    for req in running:
        release(tree, req)
    return peak, steady, compiled


def replay(mode: str, num_pages: int) -> list[tuple[int, int, int]]:
    tree = make_tree(mode, canonical_from={"mepic": 1, "epic-16": 0}[mode], num_pages=num_pages, rows=32)
    free_when_empty = tree.pages.available()
    return [run_wave(tree, wave, free_when_empty) for wave in trace()]


@pytest.mark.parametrize("num_pages", [320, 1024, 4096])
def test_mepic_holds_no_more_pages_than_epic_for_the_same_requests_in_flight(num_pages):
    mepic, epic = replay("mepic", num_pages), replay("epic-16", num_pages)
    for wave, ((m_peak, m_held, m_compiled), (e_peak, e_held, _)) in enumerate(zip(mepic, epic)):
        assert m_held <= e_held, f"wave {wave} ({WAVES[wave]} in flight): mepic holds {m_held} pages, epic-16 {e_held}"
        assert m_peak <= e_peak + 2 * m_compiled, \
            f"wave {wave}: prefill peak mepic {m_peak}, epic-16 {e_peak}, {m_compiled} chunks compiled"
    # Chunks recur across the trace: sharing them must show, not only tie.
    assert sum(m for _, m, _ in mepic) < 0.8 * sum(e for _, e, _ in epic)
