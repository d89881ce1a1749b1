"""What the mepic cache does at every decode step follows the requests, not the pool (issue 88 item 2).

A GPU decode step is a few milliseconds, and SGLang's scheduler runs the cache's per-step calls at each
one: the prefill round's hooks with nothing waiting (scheduler_get_new_batch_prefill), the figures sampled
after the step's allocation (schedule_batch_prepare_for_decode), and `evictable_size`, which it asks
several times a step. Counted here in Python calls and lines run and in tensor elements the torch ops touch, on a tree
of 250 cached pages and one of 4,000 with the same request running: a count does not depend on the
machine's load, and a Python walk of the pool or a tensor op over it shows in one or the other (a C builtin
over a pool-sized list, `sorted` say, would not: one call either way).
"""

import gc
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from support.replay import B, allocate, apply_hooks, chunked, filled, laid_out, make_tree, planned


@pytest.fixture(scope="module", autouse=True)
def hooks():
    apply_hooks()


class Elements(TorchDispatchMode):
    """Tensor elements the aten ops touch (inputs and outputs)."""

    def __init__(self):
        super().__init__()
        self.ops, self.elements = 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for x in (*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else (out,))):
            if isinstance(x, torch.Tensor):
                self.elements += x.numel()
        return out


def decode_step(tree) -> None:
    """The cache's calls at one decode step with nothing waiting (the tree parts of prefill_round and of
    the prepare_for_decode hook), with the figures published as a step that allocated a page does."""
    from sglang_mepic.cache.prefill_round import hold_back

    hold_back(tree, [])
    tree.residency.end_round()
    tree.compile_rows.end_round()
    tree.tiers.agreed()
    tree.tiers.end_round()
    for _ in range(3):
        tree.evictable_size()
    # as if the step's allocation had moved the counts, half a second after the last publish: a step that publishes
    tree.report.publish_at_next_sample()
    tree.report.sample()


def counted(pages: int) -> tuple[int, int, int]:
    """(Python calls and lines run, aten ops, tensor elements) of one decode step on a tree of `pages` cached pages,
    one request of 4 stored chunks running."""
    tree, i = filled(pages)
    req = planned(tree, *laid_out(chunked(i, [2 * i - 4, 2 * i - 3, 2 * i - 2, 2 * i - 1])))
    req.lock = tree.lock(req.last_node)
    tree.admission.admit(req)
    allocate(tree, req)
    decode_step(tree)  # first-call effects (imports, caches) are not the step's
    events = 0

    def profile(frame, event, arg):  # calls into Python and into C builtins
        nonlocal events
        if event in ("call", "c_call"):
            events += 1

    def trace(frame, event, arg):  # every line run: a Python loop over the pool shows here
        nonlocal events
        if event == "line":
            events += 1
        return trace

    gc.collect()
    gc.disable()  # a collection inside the step would run other objects' finalizers there
    try:
        with Elements() as elements:
            sys.setprofile(profile)
            sys.settrace(trace)
            try:
                decode_step(tree)
            finally:
                sys.settrace(None)
                sys.setprofile(None)
    finally:
        gc.enable()
    return events, elements.ops, elements.elements


def test_a_decode_steps_cache_work_is_the_same_on_a_pool_sixteen_times_larger():
    small, large = counted(250), counted(4000)
    assert small[0] > 20, small  # the profile saw the step
    assert large[0] <= small[0] + 20, (small, large)  # no Python walk over nodes, pages or chunks
    assert large[1] <= small[1] and large[2] <= small[2] + 64, (small, large)  # no tensor op over the pool


def test_a_busy_step_publishes_the_figures_at_most_every_half_second_the_idle_pass_at_once(monkeypatch):
    """At a decode batch of 64 a page is allocated at nearly every step, and setting the MEPIC gauges at each
    cost the step about 0.1 ms (issue 88, py-spy). While requests run, a move of the pages alone is published at
    most every PUBLISH_EVERY_S, any other count at once; the peak still follows every step, and the idle pass
    publishes what moved at once."""
    from sglang_mepic.cache import report

    now, published = [100.0], []
    # raising=False: on the code before the throttle, the test fails at its first count rather than here
    monkeypatch.setattr(report, "clock", lambda: now[0], raising=False)
    monkeypatch.setattr(report.metrics, "publish", published.append)
    tree = make_tree()
    rep, allocator = tree.report, tree.token_to_kv_pool_allocator
    rep.sample()
    assert len(published) == 1  # the first sample publishes
    for _ in range(10):  # ten decode steps 10 ms apart, each allocating a page
        assert allocator.alloc(B) is not None
        now[0] += 0.01
        rep.sample()
    assert len(published) == 1, [p["kv_pages_in_use"] for p in published]
    assert rep.peak_pages_in_use == rep.pages_in_use() == published[0]["kv_pages_in_use"] + 10
    now[0] += report.PUBLISH_EVERY_S
    rep.sample()
    assert len(published) == 2 and published[-1]["kv_pages_in_use"] == rep.pages_in_use()
    rep.counters.requests_received += 1  # a count other than the pages': published at once, busy or not
    rep.sample()
    assert len(published) == 3 and published[-1]["requests_received"] == rep.counters.requests_received
    assert allocator.alloc(B) is not None
    rep.sample(busy=False)  # the idle pass, right after
    assert len(published) == 4 and published[-1]["kv_pages_in_use_peak"] == rep.pages_in_use()
    rep.sample(busy=False)
    assert len(published) == 4  # nothing moved: nothing published
