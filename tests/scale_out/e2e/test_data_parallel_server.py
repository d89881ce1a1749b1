"""Data parallelism with the mepic cache, on real servers: a DP-2 server (two replicas of the tiny model at
float32 on the CPU, each on a core of its own) against the DP-1 one, on the cache-independence workload
(chunks that collide, repeat and reorder: tests/cache/e2e/test_cache_independence.py).

Each replica has its own scheduler and cache; SGLang's DP controller sends each request to the replica that
holds its chunks (chunk affinity, sglang_mepic/scale_out/affinity.py). A request's greedy tokens must not
depend on the replica, so DP 2 gives DP 1's, and requests sent together give what each gives alone on an empty
cache. A distinct chunk is compiled about once over the whole server (the replicas' `chunks_compiled` summed,
against DP 1's, which compiles each distinct chunk once at this size). The same workload under SGLang's round
robin, asked for by name (`--load-balance-method round_robin`, which the launcher keeps), is printed beside it:
round robin sends the requests in turn, half to each replica, and most chunks are compiled on both.
"""

import random

import pytest
import requests

from cache.e2e.test_cache_independence import B, SEED, workload
from sglang_mepic.frontend.markup import split_ids
from sglang_mepic.process.server_process import ServerProcess
from sglang_mepic.wire.layout import Kind
from support.warm_alone import flush, together, warm_then_alone

REQUESTS = 16
TOTALS = ("chunks_compiled", "compile_rows", "compiled_tokens", "chunk_hits", "reused_tokens", "requests_received")
FIGURES: dict[str, float] = {}  # compiles per distinct chunk, by routing: the last test prints them side by side


@pytest.fixture(scope="module")
def dp2(tiny_model):
    with ServerProcess(tiny_model, "--dtype", "float32", "--dp-size", "2") as server:
        yield server


@pytest.fixture(scope="module")
def work():
    return workload(random.Random(SEED))[:REQUESTS]


def generate(server, ids):
    r = requests.post(server.url + "/generate", timeout=120, json={
        "input_ids": ids, "return_logprob": True,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return r.json()["output_ids"], [lp for lp, *_ in meta["output_token_logprobs"]]


def replicas(server) -> list[dict]:
    """Each replica's mepic totals (in the order the replicas answered: the sum is what counts)."""
    states = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"]
    return [{k: state["mepic"][k] for k in TOTALS} for state in states]


def summed(states: list[dict]) -> dict:
    return {k: sum(state[k] for state in states) for k in TOTALS}


def sequence(server, work, workers=1):
    """The workload from an empty cache, in turn (workers=1) or `workers` at a time, and what the server's
    totals grew by."""
    flush(server.url)
    before = summed(replicas(server))
    if workers == 1:
        answers = [generate(server, ids) for ids in work]
    else:
        answers = together(work, lambda ids: generate(server, ids), workers)
    after = summed(replicas(server))
    return answers, {k: after[k] - before[k] for k in TOTALS}


def assert_same_tokens(work, expected, got, what):
    for i, (ids, a, b) in enumerate(zip(work, expected, got)):
        assert b[0] == a[0], f"request {i} {ids}: tokens {b[0]} {what}, {a[0]} at DP 1"
        assert b[1] == pytest.approx(a[1], abs=1e-4), f"request {i}: logprobs {b[1]} {what}, {a[1]} at DP 1"


def test_the_launcher_serves_dp_2_with_each_replica_on_its_own_core(dp2):
    info = requests.get(dp2.url + "/server_info", timeout=60).json()
    assert info["dp_size"] == 2 and info["radix_cache_backend"] == "mepic"
    assert len(info["internal_states"]) == 2 and all("mepic" in s for s in info["internal_states"])
    log = dp2.log()
    assert "numa_index=0, world_size=2" in log and "numa_index=1, world_size=2" in log, dp2.log_tail()


@pytest.fixture
def dp1(tiny_server, work):
    """DP 1's answers and totals on the workload, in turn from an empty cache: run once for the module."""
    if "dp1" not in RUNS:
        RUNS["dp1"] = sequence(tiny_server, work)
    return RUNS["dp1"]


RUNS: dict[str, tuple] = {}


def stored_chunks(ids: list[int]) -> set[tuple[int, ...]]:
    """The chunks of a request the cache stores: marked, longer than a page (a chunk of one page or less is
    computed in context every time), and none ends this workload's requests (a question follows each)."""
    # split as the server splits input_ids; the workload's tokens are all below 1 << 20
    return {p.tokens for p in split_ids(ids, 1 << 20) if p.kind is Kind.CHUNK and len(p.tokens) > B}


def affinity_compiles_at_most(work: list[list[int]]) -> tuple[int, int]:
    """(distinct chunks, the most compiles chunk affinity may make) for requests sent in turn, whatever the
    chunks' homes (they hash the model's path, so they differ between checkouts).

    In turn, no replica is over the load bound, so only preference routes, and nothing is evicted at this size.
    Each request leaves all its chunks on the one replica it went to. A request whose stored chunks some earlier
    request left together on one replica goes to a replica holding them all (the highest score) and compiles
    only its new chunks. One whose chunks no single replica is known to hold goes to a replica holding at least
    one, and may compile each of the others again: which replica each chunk went to first was a hash, and no
    router knows which chunks will be asked together later."""
    left_by: dict[tuple[int, ...], set[int]] = {}  # chunk -> the requests that left it on their replica
    most = 0
    for i, ids in enumerate(work):
        chunks = stored_chunks(ids)
        old = [c for c in chunks if c in left_by]
        most += len(chunks) - len(old)
        if old and not set.intersection(*(left_by[c] for c in old)):
            most += len(old) - 1
        for c in chunks:
            left_by.setdefault(c, set()).add(i)
    return len(left_by), most


def test_dp_2_gives_dp_1s_tokens_and_compiles_each_distinct_chunk_about_once(dp2, dp1, work):
    """A distinct chunk is compiled on a second replica only where a request carries chunks first seen apart
    (affinity_compiles_at_most). The bound was 1.1 compiles a chunk: on this workload (4 distinct chunks, one
    request joining two first seen apart) that held only where the two chunks' hashes put them on one replica
    (the keys hash the model's path too); on 2026-12-07 it failed, at that day's code and at 2afee32's alike."""
    one, one_totals = dp1
    two, two_totals = sequence(dp2, work)
    assert_same_tokens(work, one, two, "at DP 2")
    distinct = one_totals["chunks_compiled"]  # DP 1 compiles each distinct chunk once (no eviction at this size)
    assert distinct > 0 and one_totals["chunk_hits"] > 0, one_totals  # the workload has chunks, and reuses them
    assert two_totals["requests_received"] == REQUESTS, two_totals
    counted, most = affinity_compiles_at_most(work)
    assert counted == distinct, (counted, one_totals)  # the test reads the workload's chunks as the cache does
    FIGURES["affinity, in turn"] = two_totals["chunks_compiled"] / distinct
    print(f"[dp] {REQUESTS} requests in turn: {distinct} distinct chunks; DP 2 with chunk affinity compiled "
          f"{two_totals['chunks_compiled']} ({FIGURES['affinity, in turn']:.2f} a chunk; at most {most} by the "
          f"rule), tokens = DP 1's; per replica {replicas(dp2)}")
    assert two_totals["chunks_compiled"] <= most


def test_within_dp_2_outputs_do_not_depend_on_the_replica_or_what_its_cache_holds(dp2, dp1, work):
    """Four at a time from an empty cache (the controller's load bound sends some requests off their chunks'
    replica), then each alone on an empty cache: the same tokens, and DP 1's."""
    warm, alone = warm_then_alone(dp2.url, work, lambda ids: generate(dp2, ids))
    for i, (ids, w, a) in enumerate(zip(work, warm, alone)):
        assert w[0] == a[0], f"request {i} {ids}: tokens {w[0]} among others, {a[0]} alone"
        assert w[1] == pytest.approx(a[1], abs=1e-4), f"request {i}: logprobs {w[1]} among others, {a[1]} alone"
    assert_same_tokens(work, dp1[0], warm, "at DP 2, four at a time")
    _, totals = sequence(dp2, work, workers=4)
    FIGURES["affinity, 4 at a time"] = totals["chunks_compiled"] / dp1[1]["chunks_compiled"]
    print(f"[dp] {REQUESTS} requests 4 at a time: chunk affinity compiled {totals['chunks_compiled']} "
          f"({FIGURES['affinity, 4 at a time']:.2f} a distinct chunk); per replica {replicas(dp2)}")
    flush(dp2.url)
    for state in requests.get(dp2.url + "/server_info", timeout=60).json()["internal_states"]:
        assert state["mepic"]["kv_pages_free"] == state["mepic"]["kv_pages_total"], "pages held after a flush"


def test_sglangs_round_robin_asked_for_by_name_is_kept_and_compiles_on_both_replicas(tiny_model, dp1, work):
    """`--load-balance-method round_robin` is the user's choice: the requests alternate (8 to each replica),
    the tokens are DP 1's, and chunks are compiled on both replicas."""
    one, one_totals = dp1
    with ServerProcess(tiny_model, "--dtype", "float32", "--dp-size", "2",
                       "--load-balance-method", "round_robin") as rr:
        two, totals = sequence(rr, work)
        # Since start (health checks and the warm-up count too): in turn, each replica got its half or more.
        per_replica = [state["requests_received"] for state in replicas(rr)]
    assert_same_tokens(work, one, two, "under round robin")
    assert totals["requests_received"] == REQUESTS and min(per_replica) >= REQUESTS // 2, (totals, per_replica)
    FIGURES["round robin, in turn"] = totals["chunks_compiled"] / one_totals["chunks_compiled"]
    print("[dp] compiles per distinct chunk: " + ", ".join(f"{k} {v:.2f}" for k, v in FIGURES.items()))
    assert FIGURES["round robin, in turn"] > FIGURES.get("affinity, in turn", 1.0)
