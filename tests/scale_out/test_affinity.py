"""The DP controller's chunk affinity without a server (sglang_mepic/scale_out/affinity.py): a request goes where
its chunks were sent, distinct chunks spread, no replica is sent a request at or over the load bound, a
replica leaving moves only its own chunks, a tenant's routing does not depend on another's chunks, and on the
workload the e2e tests send, each distinct chunk lands on about one replica (round robin: on both)."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_mepic.scale_out.affinity import EPS, AffinityRouter, Chunk, home, load_bound
from support.dp_requests import chunk_of, compiles_per_chunk, workload_requests

REPLICAS = [0, 1]


def idle(replicas=REPLICAS):
    return dict.fromkeys(replicas, 0)


def test_a_request_goes_where_its_chunks_were_sent():
    router = AffinityRouter()
    doc, other = Chunk("doc", 64), Chunk("other", 32)
    first = router.choose([doc], REPLICAS, idle())
    assert all(router.choose([doc], REPLICAS, idle()) == first for _ in range(20))
    assert router.choose([doc], list(reversed(REPLICAS)), idle()) == first  # the replicas' order says nothing
    # A chunk first seen beside a held one goes with it, and is then held there.
    assert router.choose([other, doc], REPLICAS, idle()) == first
    assert router.holders("other") == {first}
    assert router.choose([other], REPLICAS, idle()) == first


def test_distinct_chunks_spread_over_the_replicas_each_to_its_home():
    replicas = [0, 1, 2, 3]
    router = AffinityRouter()
    placed = Counter()
    for i in range(400):
        key = f"chunk-{i}"
        chosen = router.choose([Chunk(key, 32)], replicas, idle(replicas))
        assert chosen == home(key, replicas)
        placed[chosen] += 1
    assert all(60 <= placed[r] <= 140 for r in replicas), placed  # 100 each, expected


def test_a_replica_leaving_moves_only_the_chunks_homed_on_it():
    before, after = [0, 1, 2, 3], [0, 1, 3]
    keys = [f"chunk-{i}" for i in range(300)]
    moved = [k for k in keys if home(k, before) != home(k, after)]
    assert moved and all(home(k, before) == 2 for k in moved)


def test_the_bound_holds_for_a_chunk_every_request_asks():
    """One hot chunk and no request finishing: affinity gives way at the bound, so the replicas stay within
    (1 + eps) of the mean (plus one), where affinity alone would queue every request on one replica."""
    router, loads = AffinityRouter(), idle([0, 1, 2])
    for sent in range(60):
        chosen = router.choose([Chunk("hot", 64)], [0, 1, 2], loads)
        assert loads[chosen] < load_bound(sent, 3)
        loads[chosen] += 1
    assert max(loads.values()) <= load_bound(59, 3) and min(loads.values()) > 0, loads


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 5), max_size=3), st.integers(0, 3)), max_size=80),
       st.sampled_from([0.1, EPS, 1.0]), st.integers(1, 4))
def test_no_replica_is_sent_a_request_at_or_over_the_bound(steps, eps, n):
    """Any mix of requests (chunks drawn from a few, so that they collide) and finished requests."""
    replicas = list(range(n))
    router, loads = AffinityRouter(eps=eps), idle(replicas)
    for send, chunk_ids, replica in steps:
        if not send:
            if loads[replica % n]:
                loads[replica % n] -= 1
            continue
        chosen = router.choose([Chunk(f"c{i}", 16 * (i + 1)) for i in chunk_ids], replicas, loads)
        assert chosen in replicas
        assert loads[chosen] < load_bound(sum(loads.values()), n, eps), (loads, chosen)
        loads[chosen] += 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.lists(st.integers(0, 4), min_size=1, max_size=3)),
                max_size=40))
def test_a_tenants_preference_does_not_depend_on_another_tenants_chunks(requests):
    """Tenant b's requests carry the same texts as a's, keyed in b's namespace: a router that also routed b's
    requests prefers, for each of a's requests, what a router that routed a's alone prefers (loads equal)."""
    both, a_only = AffinityRouter(), AffinityRouter()
    for tenant, docs in requests:
        chunks = [chunk_of(f"doc {d}", extra_key=tenant) for d in docs]
        if tenant == "a":
            assert both.preference(chunks, REPLICAS) == a_only.preference(chunks, REPLICAS)
            a_only.choose(chunks, REPLICAS, idle())
        both.choose(chunks, REPLICAS, idle())


def test_requests_without_chunks_go_to_the_least_loaded_in_turn():
    router = AffinityRouter()
    assert router.choose([], [0, 1, 2], {0: 3, 1: 1, 2: 5}) == 1
    assert [router.choose([], [0, 1], idle()) for _ in range(4)] in ([0, 1, 0, 1], [1, 0, 1, 0])


def test_what_it_remembers_is_bounded():
    router = AffinityRouter(memory=3)
    for key in "abcde":
        router.choose([Chunk(key, 32)], REPLICAS, idle())
    assert not router.holders("a") and not router.holders("b") and router.holders("e")
    with pytest.raises(ValueError):
        AffinityRouter(eps=0)
    with pytest.raises(ValueError):
        router.choose([Chunk("a", 32)], [], {})


@pytest.mark.parametrize("in_flight", [1, 4])
def test_on_the_e2e_workload_each_chunk_lands_on_about_one_replica(in_flight):
    """The cache-independence workload (chunks that collide, repeat and reorder) through the router's own keys:
    in turn (one request in flight) and four at a time. A replica compiles each distinct chunk it is sent
    once (no eviction at this size); round robin sends most chunks to both replicas."""
    reqs = workload_requests()
    affinity = compiles_per_chunk(reqs, AffinityRouter(), REPLICAS, in_flight)
    round_robin = compiles_per_chunk(reqs, None, REPLICAS, in_flight)
    print(f"[dp] {len(reqs)} requests, {in_flight} in flight: compiles per distinct chunk {affinity:.2f} with "
          f"affinity, {round_robin:.2f} with round robin")
    if in_flight == 1:
        assert affinity <= 1.1
    else:
        assert affinity < round_robin
    assert round_robin > 1.3


def test_the_workload_spreads_over_both_replicas_when_requests_overlap():
    reqs = workload_requests(48)
    router, loads, sent = AffinityRouter(), idle(), Counter()
    rng = random.Random(0)
    flight = []
    for chunks in reqs:
        chosen = router.choose(chunks, REPLICAS, loads)
        loads[chosen] += 1
        flight.append(chosen)
        sent[chosen] += 1
        if len(flight) >= 4:  # one of the four in flight finishes
            loads[flight.pop(rng.randrange(len(flight)))] -= 1
    assert min(sent.values()) >= len(reqs) // 4, sent
