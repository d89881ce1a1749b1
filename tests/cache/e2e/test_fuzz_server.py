"""Fuzz one real server with chunks that collide, under SGLang's strict idle leak check.

Chunks are token-id runs from a four-id alphabet in the shapes that make the radix tree
and the chunk store reach one physical page by different keys (tests/properties/test_collisions.py
checks the same shapes without a server). A few hundred requests go out in a random
order, several at a time, some streamed and dropped by their client. The device pool is
small, so chunks are evicted while others run. The server must then idle (SGLang checks
`available + evictable == total` at every idle step and dies on a leak), answer, and
give every page back on a flush.

CI runs a fixed seed, so a failure there replays as is; MEPIC_FUZZ_SEED=<n> runs another
and MEPIC_FUZZ_SEED=random draws one. The seed is printed and named in every failure.
"""

import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglang_mepic.process.server_process import ServerProcess

REQUESTS = int(os.environ.get("MEPIC_FUZZ_REQUESTS", 300))
SEED = 1146880928  # the seed that took the server down before the shared-page fix
POOL_TOKENS = 1024  # 64 pages: the chunks of a few requests fill it
ALPHABET = range(100, 104)
B = 16


def chunk_family(rng: random.Random) -> list[list[int]]:
    def tokens(n):
        return [rng.choice(ALPHABET) for _ in range(n)]

    family = []
    for _ in range(3):
        a = tokens(rng.randint(B + 2, 4 * B))
        k = rng.randint(1, len(a) // B)
        cut = rng.randint(1, len(a) - B - 1)
        last = rng.choice([t for t in ALPHABET if t != a[-1]])
        family += [a,
                   a[:k * B] + tokens(rng.randint(1, 2 * B)),  # starts with A's first k pages
                   a + tokens(rng.randint(1, 2 * B)),          # A plus more
                   a[cut:],                                     # a suffix of A
                   a[:-1] + [last]]                             # differs only in the last token
    return family


def jobs(rng: random.Random, family: list[list[int]]) -> list[dict]:
    out = []
    for _ in range(REQUESTS):
        picks = rng.sample(family, rng.randint(1, 3))
        if rng.random() < 0.2:
            picks.append(picks[0])  # the same chunk twice in one request
        prompt = rng.choice(family) if rng.random() < 0.2 else [rng.choice(ALPHABET) for _ in range(rng.randint(1, 20))]
        ids = list(prompt)
        for c in picks:
            ids += [-100, *c, -101, rng.choice(ALPHABET)]
        ids += [5, 6, 7]
        stream = rng.random() < 0.3
        out.append({"input_ids": ids, "stream": stream, "drop": stream and rng.random() < 0.3,
                    "sampling_params": {"max_new_tokens": rng.randint(1, 6), "temperature": 0,
                                        "ignore_eos": True}})
    return out


def send(server, job) -> str:
    try:
        return _send(server, job)
    except requests.RequestException as e:  # the server went away: report it with its log
        return f"{type(e).__name__}: {e}"


def _send(server, job) -> str:
    body = {k: job[k] for k in ("input_ids", "stream", "sampling_params")}
    with requests.post(server.url + "/generate", json=body, stream=job["stream"], timeout=120) as r:
        if r.status_code != 200:
            return f"{r.status_code}: {r.text[:200]}"
        if not job["stream"]:
            return "ok" if r.json()["meta_info"]["completion_tokens"] >= 1 else "no tokens"
        for line in r.iter_lines():
            if line.startswith(b"data:") and job["drop"]:
                return "ok"  # the client goes away mid-stream; the server aborts the request
        return "ok"


def mepic(server) -> dict:
    return requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


@pytest.mark.timeout(300)  # the server's start is most of it
def test_colliding_chunks_never_leak_a_page(tiny_model):
    assert os.environ.get("SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE", "true").lower() in ("1", "true")
    chosen = os.environ.get("MEPIC_FUZZ_SEED", str(SEED))
    seed = random.randrange(2 ** 32) if chosen == "random" else int(chosen)
    print(f"[fuzz] seed {seed} (replay: MEPIC_FUZZ_SEED={seed})")
    rng = random.Random(seed)
    family = chunk_family(rng)
    work = jobs(rng, family)
    with ServerProcess(tiny_model, "--dtype", "float32", "--max-total-tokens", str(POOL_TOKENS)) as server:
        total = mepic(server)["kv_pages_total"]
        start = time.time()
        for wave in range(0, len(work), 24):  # waves of concurrent requests, then a short idle
            with ThreadPoolExecutor(rng.choice([1, 4, 8])) as pool:
                results = list(pool.map(lambda job: send(server, job), work[wave:wave + 24]))
            bad = [(r, json.dumps(j["input_ids"])) for r, j in zip(results, work[wave:wave + 24]) if r != "ok"]
            assert not bad, f"seed {seed}: {bad[:3]}\n{server.log_tail()}"
            assert server.proc.poll() is None, f"seed {seed}: the server died\n{server.log_tail()}"
        elapsed = time.time() - start
        time.sleep(3)  # idle: SGLang runs its leak check at every idle step
        assert server.proc.poll() is None, f"seed {seed}: the server died idle\n{server.log_tail()}"
        r = requests.post(server.url + "/generate", timeout=60,
                          json={"input_ids": work[0]["input_ids"], "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 200, f"seed {seed}: {r.text}"
        assert requests.post(server.url + "/flush_cache", timeout=60).status_code == 200
        stats = mepic(server)
        assert stats["kv_pages_free"] == total, f"seed {seed}: {stats}"
        assert "leak" not in server.log(), f"seed {seed}\n{server.log_tail()}"
        print(f"[fuzz] seed {seed}: {len(work)} requests in {elapsed:.1f} s, "
              f"{stats['chunk_evictions']} chunk evictions, {stats['chunks_compiled']} compiles, "
              f"{sum(j['drop'] for j in work)} dropped streams")
