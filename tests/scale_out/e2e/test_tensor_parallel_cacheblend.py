"""CacheBlend under tensor parallelism, on real servers: `--mepic-mode cacheblend-0.15` at TP 2 against TP 1
(the 4-layer tiny model, float32, on the CPU: SGLang runs the ranks over gloo).

CacheBlend recomputes, after its check layer (layer 1), the tokens whose fresh KV deviates most from the stored
KV, the deviation summed over all heads. Each TP rank holds only its own heads, so the backend sums the per-token
deviation over the ranks (an all-reduce over SGLang's TP group, attention/blend.py) before it selects, and
every rank recomputes the tokens TP 1 recomputes. Ranks that chose apart would mix stored and fresh KV of one
token across heads, an output no TP-1 server gives.

The 4-layer model, not the 2-layer one: there the check layer is the last, where every token writes its fresh
KV, so which tokens were chosen would change no output and this test could not fail. One server runs at a
time: TP 1's answers first, then the TP-2 server for the module.
"""

import random

import pytest
import requests

from cache.e2e.test_cache_independence import SEED, workload
from sglang_mepic.launch import models
from sglang_mepic.process.server_process import ServerProcess
from support import tp_requests

MODE = ("--mepic-mode", "cacheblend-0.15")
REQUESTS = 10  # of the independence workload (seed SEED): about a minute at TP 2 on 2 cores
REPORT = ("cached_tokens", "mepic_compiled_tokens", "mepic_recomputed_tokens", "mepic_chunk_hits",
          "mepic_chunk_misses")
TOTALS = ("chunk_hits", "chunk_misses", "compiled_tokens", "recomputed_tokens", "reused_tokens")


@pytest.fixture(scope="module")
def four_layers():
    return str(models.build(models.EVAL_MODEL))


@pytest.fixture(scope="module")
def work():
    return workload(random.Random(SEED))[:REQUESTS]


def sequence(server, work):
    return tp_requests.sequence(server, work, REPORT, TOTALS, timeout=180)


@pytest.fixture(scope="module")
def tp1(four_layers, work):
    with ServerProcess(four_layers, "--dtype", "float32", *MODE) as server:
        return sequence(server, work)


@pytest.fixture(scope="module")
def tp2(four_layers, tp1):  # after TP 1's server has stopped
    with ServerProcess(four_layers, "--dtype", "float32", "--tp-size", "2", *MODE) as server:
        yield server


def test_cacheblend_at_tp_2_recomputes_what_tp_1_recomputes(tp1, tp2, work):
    one, one_totals = tp1
    info = requests.get(tp2.url + "/server_info", timeout=60).json()
    assert info["tp_size"] == 2
    two, two_totals = sequence(tp2, work)
    for i, (ids, a, b) in enumerate(zip(work, one, two)):
        assert b[0] == a[0], f"request {i} {ids}: tokens {b[0]} at TP 2, {a[0]} at TP 1"
        assert b[2] == a[2], f"request {i} {ids}: report {b[2]} at TP 2, {a[2]} at TP 1"
        assert b[1] == pytest.approx(a[1], abs=1e-5), f"request {i}: logprobs {b[1]} at TP 2, {a[1]} at TP 1"
    assert two_totals == one_totals
    # The workload blends: requests read stored chunks, and some of their tokens were chosen to recompute.
    assert one_totals["reused_tokens"] > 0 and one_totals["recomputed_tokens"] > 0, one_totals
    worst = max(abs(x - y) for a, b in zip(one, two) for x, y in zip(a[1], b[1]))
    print(f"[tp cacheblend] {REQUESTS} requests: TP 2 = TP 1 in tokens and figures {two_totals}; largest "
          f"logprob difference {worst:.2e}")
