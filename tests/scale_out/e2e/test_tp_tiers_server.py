"""Shared storage and the host tier under tensor parallelism, on real TP-2 servers (the tiny model, float32, on
the CPU over gloo): the ranks agree each round on what the tiers give (tiers/agreement.py), and with
SGLANG_MEPIC_CHECK_RANKS=1 every round's plan is compared across the ranks, so a rank that planned apart
would end the server with "MEPIC rank check" in its log.

One TP-2 server for the module, with a file tier, a host tier and a device pool too small for the
workload's chunks (the store evicts them to the host tier and loads them back), a test-only fault that
makes rank 1's storage reads time out while a file exists, and a forward fault for rank 1 only (the last
test: it ends the server). A second TP-2 server on the same directory is the restart.

On the code before, the launcher refused --mepic-storage-dir and --mepic-host-tier-gb with --tp-size 2.
"""

import random
import time

import pytest
import requests

from sglang_mepic.env import CHECK_RANKS_ENV
from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID as BEG
from sglang_mepic.frontend.markup import CHUNK_END_ID as END
from sglang_mepic.hardening.batch_guard import FAULT_ENV
from sglang_mepic.process.server_process import ServerProcess
from sglang_mepic.tiers.prefetch import SLOW_READS_ENV
from support.warm_alone import flush

B = 16
CHUNK_PAGES = 16
POOL_PAGES = 64  # four chunks' canonical pages (15 each) do not fit beside the requests: the store evicts
FAULT_RID = "tp-one-rank-fault"
REPORT = ("cached_tokens", "mepic_compiled_tokens", "mepic_residency")


def _ids(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(100, 4000) for _ in range(n)]


CHUNKS = [_ids(CHUNK_PAGES * B, seed) for seed in range(4)]
INSTRUCTION = _ids(5, 100)


def prompt(chunk, k=0):
    return INSTRUCTION + [BEG, *chunk, END] + _ids(3, 1000 + k)


# Each chunk once, then the first two again: by then the store has evicted them to the host tier.
WORK = [prompt(c, i) for i, c in enumerate(CHUNKS)] + [prompt(CHUNKS[0], 10), prompt(CHUNKS[1], 11)]


def generate(server, ids, rid=None):
    body = {"input_ids": ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}
    if rid is not None:
        body["rid"] = rid
    r = requests.post(server.url + "/generate", timeout=300, json=body)
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return r.json()["output_ids"], [lp for lp, *_ in meta["output_token_logprobs"]], \
        {k: meta.get(k) for k in REPORT}


def mepic(server) -> dict:
    """Rank 0's figures (each rank's would be the same but for tier_overruled: the ranks plan alike)."""
    return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def same_answers(got, want, what):
    for i, (g, w) in enumerate(zip(got, want)):
        assert g[0] == w[0], f"request {i}: tokens {g[0]} {what}, {w[0]} at TP 1 cold"
        assert g[1] == pytest.approx(w[1], abs=1e-3), f"request {i}: logprobs {g[1]} {what}, {w[1]} at TP 1"


def tp2_flags(storage, *more):
    return ("--dtype", "float32", "--tp-size", "2", "--mepic-storage-dir", str(storage), *more)


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    return tmp_path_factory.mktemp("tp-chunk-files")


@pytest.fixture(scope="module")
def slow_reads(tmp_path_factory):
    """While this file exists, rank 1's storage reads wait past the timeout (SLOW_READS_ENV)."""
    return tmp_path_factory.mktemp("tp-faults") / "slow-reads"


@pytest.fixture(scope="module")
def cold_tp1(servers):
    """The workload at TP 1 on the default server (no tier below, a large pool), each request in turn from an
    empty cache: what every other run must answer."""
    server = servers.get()
    flush(server.url)
    return [generate(server, ids) for ids in WORK]


@pytest.fixture(scope="module")
def tp2(tiny_model, storage, slow_reads, cold_tp1):
    env = {CHECK_RANKS_ENV: "1", SLOW_READS_ENV: f"1:{slow_reads}", FAULT_ENV: f"rank1:{FAULT_RID}"}
    with ServerProcess(tiny_model, *tp2_flags(storage, "--mepic-host-tier-gb", "0.05", "--max-total-tokens",
                                              str(POOL_PAGES * B)), env=env) as server:
        yield server


@pytest.fixture(scope="module")
def tp2_cold(tp2):
    """The workload on the TP-2 server from an empty cache and an empty directory: compiled, written through,
    evicted to the host tier and loaded back."""
    flush(tp2.url)
    before = mepic(tp2)
    answers = [generate(tp2, ids) for ids in WORK]
    return answers, before, mepic(tp2)


def assert_ranks_agreed(server):
    assert server.proc.poll() is None and "MEPIC rank check" not in server.log(), server.log_tail()


def test_the_host_tier_demotes_and_reloads_at_tp_2_and_answers_as_tp_1_cold(tp2, tp2_cold, cold_tp1):
    answers, before, after = tp2_cold
    same_answers(answers, cold_tp1, "at TP 2 with a host tier and storage")
    assert after["tier_loads_host"] > before["tier_loads_host"], after
    assert any("host" in a[2]["mepic_residency"] for a in answers[len(CHUNKS):]), [a[2] for a in answers]
    assert after["tier_rounds_agreed"] > before["tier_rounds_agreed"], after  # the ranks agreed each round
    assert_ranks_agreed(tp2)


def test_one_ranks_storage_reads_timing_out_are_a_miss_on_both_ranks(tp2, tp2_cold, cold_tp1, slow_reads):
    """Rank 0 reads every chunk from the directory, rank 1's reads time out: the ranks agree on a miss, both
    compute the chunks, and the answers are unchanged (a rank loading what another computes would pair
    other page ids with its collectives; the rank check would end the server)."""
    flush(tp2.url)  # the device pool, the host tier and what the reads remembered are empty again
    before = mepic(tp2)
    slow_reads.touch()
    try:
        answers = [generate(tp2, ids) for ids in WORK[:len(CHUNKS)]]
    finally:
        slow_reads.unlink()
    after = mepic(tp2)
    same_answers(answers, cold_tp1, "with rank 1's reads timing out")
    assert all(a[2]["mepic_residency"] == ["absent"] for a in answers), [a[2] for a in answers]
    # Rank 0 had the first chunk ready while rank 1 still read it (later ones may be agreed absent sooner:
    # rank 1 leaves the backend alone after the timeout, so its answer comes first).
    assert after["tier_overruled"] > before["tier_overruled"], after
    assert after["tier_loads_storage"] == before["tier_loads_storage"], after
    assert "MEPIC storage (file) unavailable: no answer within" in tp2.log(), tp2.log_tail()
    assert_ranks_agreed(tp2)


def test_a_restart_loads_from_storage_and_one_ranks_lost_entry_is_a_miss_on_both(tiny_model, storage, tp2_cold,
                                                                                 cold_tp1):
    """A second TP-2 server on the directory the first wrote: it loads every chunk from storage and answers as
    TP 1 cold. Then a chunk whose entry only rank 0 still has: both ranks compute it, with no hang."""
    with ServerProcess(tiny_model, *tp2_flags(storage), env={CHECK_RANKS_ENV: "1"}) as second:
        answers = [generate(second, ids) for ids in WORK[:len(CHUNKS)]]
        same_answers(answers, cold_tp1[:len(CHUNKS)], "after a restart")
        assert all(a[2]["mepic_residency"] == ["storage"] for a in answers), [a[2] for a in answers]

        fresh = prompt(_ids(CHUNK_PAGES * B, 99))
        rank1 = set(storage.glob("*_mepic_1_2.bin"))
        first = generate(second, fresh)  # computed and written, one entry per rank
        deadline = time.monotonic() + 30
        while not (written := set(storage.glob("*_mepic_1_2.bin")) - rank1) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(written) == 1, written
        written.pop().unlink()
        flush(second.url)
        again = generate(second, fresh)
        assert again[0] == first[0] and again[1] == pytest.approx(first[1], abs=1e-4)
        # Rank 0 found its entry (its figures would say storage), yet it computed the chunk as rank 1 did.
        assert again[2]["mepic_residency"] == ["absent"] and again[2]["mepic_compiled_tokens"] > 0, again[2]
        assert_ranks_agreed(second)


def test_a_forward_that_raises_on_one_rank_only_ends_the_server_rather_than_hanging_it(tp2):
    """Rank 1's forward raises, rank 0's runs into the collective rank 1 never reaches: batch_guard re-raises
    under TP and SGLang takes the whole server down within seconds (docs/scale-out.md). Runs last: it ends
    the module's server."""
    started = time.monotonic()
    try:
        r = requests.post(tp2.url + "/generate", timeout=120, json={
            "input_ids": prompt(CHUNKS[2], 50), "rid": f"{FAULT_RID}-1", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code >= 500, r.text
    except requests.ConnectionError:
        pass  # the server went down before it answered
    deadline = time.monotonic() + 60
    while tp2.proc.poll() is None:
        assert time.monotonic() < deadline, f"the TP-2 server still runs 60 s after rank 1's forward raised:\n" \
                                            f"{tp2.log_tail()}"
        time.sleep(0.5)
    assert "InjectedFault" in tp2.log()
    print(f"[tp] a forward raising on rank 1 only ended the TP-2 server in {time.monotonic() - started:.1f} s")
