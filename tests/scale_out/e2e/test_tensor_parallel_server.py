"""Tensor parallelism with the mepic cache, on real servers: a TP-2 server against the TP-1 one (the tiny model,
float32, on the CPU: SGLang runs the ranks over gloo, each bound to its own core by the launcher).

Each rank keeps its own heads of every page and runs the same scheduler on the same requests, so the two
servers must give the same greedy tokens and the same reuse figures (per request, and the server's totals),
and within TP 2 a request's output must not depend on what the cache holds (warm == alone, as
tests/cache/e2e/test_cache_independence.py checks at TP 1, on its workload). One TP-2 server is started for
the module; the last test makes its forward raise, which must take the whole server down, not hang it.
"""

import random
import time

import pytest
import requests

from cache.e2e.test_cache_independence import SEED, workload
from sglang_mepic.env import CHECK_RANKS_ENV
from sglang_mepic.hardening.batch_guard import FAULT_ENV
from sglang_mepic.process.server_process import ServerProcess
from support import tp_requests
from support.warm_alone import flush, warm_then_alone

REQUESTS = 16  # of the independence workload (seed SEED): chunks that collide, repeat and reorder
FAULT_RID = "tp-fault"
REPORT = ("cached_tokens", "mepic_compiled_tokens", "mepic_recomputed_tokens", "mepic_chunk_hits",
          "mepic_chunk_misses", "mepic_residency", "mepic_chunks")
TOTALS = ("chunk_hits", "chunk_misses", "chunks_compiled", "compiled_tokens", "compile_rows", "recomputed_tokens",
          "reused_tokens", "requests_received")


@pytest.fixture(scope="module")
def tp2(tiny_model):
    # Every round's plan is compared across the ranks (SGLANG_MEPIC_CHECK_RANKS): a rank that planned apart ends it.
    with ServerProcess(tiny_model, "--dtype", "float32", "--tp-size", "2",
                       env={FAULT_ENV: FAULT_RID, CHECK_RANKS_ENV: "1"}) as server:
        yield server


@pytest.fixture(scope="module")
def work():
    return workload(random.Random(SEED))[:REQUESTS]


def generate(server, ids, rid=None):
    return tp_requests.generate(server, ids, REPORT, rid=rid)


def sequence(server, work):
    return tp_requests.sequence(server, work, REPORT, TOTALS)


def test_the_launcher_serves_tp_2_with_each_rank_on_its_own_core(tp2):
    info = requests.get(tp2.url + "/server_info", timeout=60).json()
    assert info["tp_size"] == 2 and info["radix_cache_backend"] == "mepic"
    log = tp2.log()
    assert "numa_index=0, world_size=2, local_omp_cpuid=0" in log and "numa_index=1, world_size=2" in log, \
        tp2.log_tail()


def test_tp_2_gives_the_tokens_and_reuse_figures_of_tp_1(tp2, tiny_server, work):
    one, one_totals = sequence(tiny_server, work)
    two, two_totals = sequence(tp2, work)
    for i, (ids, a, b) in enumerate(zip(work, one, two)):
        assert b[0] == a[0], f"request {i} {ids}: tokens {b[0]} at TP 2, {a[0]} at TP 1"
        assert b[2] == a[2], f"request {i} {ids}: report {b[2]} at TP 2, {a[2]} at TP 1"
        assert b[1] == pytest.approx(a[1], abs=1e-3), f"request {i}: logprobs {b[1]} at TP 2, {a[1]} at TP 1"
    assert two_totals == one_totals
    assert one_totals["chunk_hits"] > 0 and one_totals["reused_tokens"] > 0, one_totals  # the workload reuses
    worst = max(abs(x - y) for a, b in zip(one, two) for x, y in zip(a[1], b[1]))
    print(f"[tp] {REQUESTS} requests: TP 2 = TP 1 in tokens and figures {two_totals}; largest logprob "
          f"difference {worst:.2e}")


def test_within_tp_2_outputs_do_not_depend_on_what_the_cache_holds(tp2, work):
    warm, alone = warm_then_alone(tp2.url, work, lambda ids: generate(tp2, ids))
    for i, (ids, w, a) in enumerate(zip(work, warm, alone)):
        assert w[0] == a[0], f"request {i} {ids}: tokens {w[0]} on a warm cache, {a[0]} alone"
        assert w[1] == pytest.approx(a[1], abs=1e-4), f"request {i}: logprobs {w[1]} warm, {a[1]} alone"
    flush(tp2.url)
    state = requests.get(tp2.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]
    assert state["kv_pages_free"] == state["kv_pages_total"], "pages held after a flush"


def test_a_forward_that_raises_under_tp_ends_the_server_rather_than_hanging_it(tp2):
    """batch_guard turns a raising forward into its requests' 500 only on one rank; under TP it re-raises
    (a rank serving on would pair its collectives with the others'), and SGLang takes the server down.
    Runs last: it ends the module's server."""
    started = time.monotonic()
    try:
        r = requests.post(tp2.url + "/generate", timeout=120, json={
            "text": "a b c", "rid": f"{FAULT_RID}-1", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code >= 500, r.text
    except requests.ConnectionError:
        pass  # the server went down before it answered
    deadline = time.monotonic() + 60
    while tp2.proc.poll() is None:
        assert time.monotonic() < deadline, f"the TP-2 server still runs 60 s after a forward raised:\n" \
                                            f"{tp2.log_tail()}"
        time.sleep(0.5)
    assert "InjectedFault" in tp2.log()
    print(f"[tp] a raising forward ended the TP-2 server in {time.monotonic() - started:.1f} s")
