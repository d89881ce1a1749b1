"""Does a big cached tree slow the scheduler down? Decode-step time, empty tree against full.

    .venv/bin/python -m eval.bench.pool [--pool-tokens 1048576] [--fill-pages 50000] [--requests 200]
                                        [--fill-tokens 4000]

Two runs, each on a fresh server with the tiny model and a pool of `--pool-tokens`:
the first serves the workload on an empty tree; the second first fills the tree
with plain prompts of distinct tokens (`--fill-tokens`, 4,000 each, one output token) until
the pool holds `--fill-pages` cached pages, then serves the same workload. The
workload is `--requests` chunked requests (4 chunks from a pool of 32, streamed,
24 output tokens each, 8 at a time). A decode step's time is measured by the
client as the gap between successive streamed tokens, averaged over every gap
of every request; the scheduler's per-step bookkeeping (evictable size, stats,
eviction) is inside it.
"""

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import requests
from tqdm import tqdm

from eval.lib import served
from sglang_mepic.launch import models

OUTPUT_TOKENS = 24


def state(url: str) -> dict:
    return requests.get(url + "/server_info", timeout=60).json()["internal_states"][0]["mepic"]


def cached_pages(url: str) -> int:
    s = state(url)
    return s["kv_pages_total"] - s["kv_pages_free"]


def fill(url: str, pages: int, seed: int, tokens: int = 4000) -> int:
    rng = random.Random(seed)

    def one(_):
        ids = [rng.randrange(10, 4000) for _ in range(tokens)]
        r = requests.post(url + "/generate", timeout=600, json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
        r.raise_for_status()

    with tqdm(total=pages, desc="filling the tree", unit="page") as bar, ThreadPoolExecutor(4) as pool:
        while (n := cached_pages(url)) < pages:
            bar.update(n - bar.n)
            list(pool.map(one, range(8)))
        bar.update(n - bar.n)
    return n


def workload(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    chunks = [[rng.randrange(10, 4000) for _ in range(rng.randint(100, 300))] for _ in range(32)]
    out = []
    for i in range(n):
        ids = [5, 6, 7, i % 100]
        for c in rng.sample(chunks, 4):
            ids += [-100, *c, -101]
        out.append(ids + [9, 8, 7])
    return out


def decode_gaps(url: str, ids: list[int]) -> list[float]:
    body = {"input_ids": ids, "stream": True,
            "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "temperature": 0, "ignore_eos": True}}
    stamps = []
    with requests.post(url + "/generate", json=body, stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data:") and line != b"data: [DONE]":
                json.loads(line[5:])
                stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps, stamps[1:])]


def run(model: str, pool_tokens: int, fill_pages: int, work: list[list[int]], seed: int, fill_tokens: int = 4000,
        url: str | None = None) -> dict:
    with served.server(url, model, "--dtype", "float32", "--max-total-tokens", str(pool_tokens),
                       "--chunked-prefill-size", "4096", startup_timeout=600) as server:
        if url:  # a server that has served before: start from an empty tree, as a fresh one does
            requests.post(server.url + "/flush_cache", timeout=120).raise_for_status()
        filled = fill(server.url, fill_pages, seed, fill_tokens) if fill_pages else cached_pages(server.url)
        gaps = []
        start = time.time()
        with ThreadPoolExecutor(8) as pool:
            for g in tqdm(pool.map(lambda ids: decode_gaps(server.url, ids), work), total=len(work),
                          desc="workload", unit="req"):
                gaps += g
        return {"tree pages before": filled, "pages after": cached_pages(server.url),
                "kv pages total": state(server.url)["kv_pages_total"], "requests": len(work),
                "decode gaps": len(gaps), "mean decode step ms": statistics.mean(gaps) * 1e3,
                "median decode step ms": statistics.median(gaps) * 1e3, "workload s": time.time() - start}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool-tokens", type=int, default=1 << 20)
    ap.add_argument("--fill-pages", type=int, default=50_000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--fill-tokens", type=int, default=4000, help="tokens of each prompt that fills the tree")
    ap.add_argument("--seed", type=int, default=0)
    served.add_url(ap)
    args = ap.parse_args()
    model = str(models.build(models.TEST_MODEL))
    work = workload(args.requests, args.seed)
    empty = run(model, args.pool_tokens, 0, work, args.seed, args.fill_tokens, args.url)
    full = run(model, args.pool_tokens, args.fill_pages, work, args.seed, args.fill_tokens, args.url)
    pool = (f"the server at {args.url} (--url, {full['kv pages total']:,} pages)" if args.url
            else f"pool {args.pool_tokens:,} tokens")
    print(f"\ntiny model, float32, {pool}; {args.requests} chunked requests, "
          f"{OUTPUT_TOKENS} streamed tokens each, 8 at a time\n")
    print("| tree | pages cached before | mean decode step (ms) | median (ms) | gaps |")
    print("|---|---|---|---|---|")
    for name, r in (("empty", empty), ("filled", full)):
        print(f"| {name} | {r['tree pages before']:,} | {r['mean decode step ms']:.2f} | "
              f"{r['median decode step ms']:.2f} | {r['decode gaps']:,} |")
    print(f"\nfilled / empty, mean decode step: {full['mean decode step ms'] / empty['mean decode step ms']:.3f}")


if __name__ == "__main__":
    main()
