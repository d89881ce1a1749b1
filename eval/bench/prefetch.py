"""Scheduler-thread time of loading a request's chunks from file storage: the synchronous
read the cache made before 2026-11-24 (`sync_fetch`, `Storage.get` on the scheduler's
thread) against the background one it makes now (`Tiers.want`/`take`, prefetch.py).

    .venv/bin/python -m eval.bench.prefetch [--model models/tiny] [--chunks 8] [--chunk-pages 4,32] [--reps 20]

A KV pool of the model's shape (layers, KV heads, head dim, dtype from its
config.json) at page size 16 on the CPU; `--chunks` chunk entries written to a
file storage directory (HiCacheFile) by one instance and loaded by another. Each
figure is the median over `--reps` requests of the time spent on the calling
(scheduler) thread for all the request's chunks, in ms:

- sync fetch+place: today's plan, each chunk read, checked and copied in;
- sync fetch, no room: a request waiting for room, each round (read and checked
  again, then dropped);
- want (round 1): the reads started;
- want+take+place (ready): the round after the reads are done;
- want, no room: a waiting request's later rounds (answered from memory);
- background wait: wall time from the first want until every read is done (not
  scheduler time: the request waits for it, the scheduler does not).

Files are read from the OS page cache after the first repetition, for both paths.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

import torch  # noqa: E402

from sglang_mepic.tiers.levels import Tiers  # noqa: E402
from sglang_mepic.tiers.prefetch import PENDING  # noqa: E402
from sglang_mepic.tiers.storage import Storage  # noqa: E402

PAGE = 16



def sync_fetch(tiers, key: str, num_slots: int):
    """The synchronous load the cache made before the prefetch: the entry read and checked on
    the calling thread, up to the storage timeout."""
    kv = tiers.storage.get(key, tiers.device.empty(num_slots))
    return None if kv is None else (kv, "storage")

def kv_shape(config: dict) -> tuple[int, int, int, torch.dtype]:
    """Layers, KV heads, head dim and dtype of the model's KV cache."""
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "float32")
    return config["num_hidden_layers"], heads, head_dim, dtype


def kv_pool(config: dict, pages: int):
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    layers, heads, head_dim, dtype = kv_shape(config)
    pool = MHATokenToKVPool(pages * PAGE, PAGE, dtype, heads, head_dim, layers, "cpu", False,
                            start_layer=0, end_layer=layers - 1)
    for k, v in zip(pool.k_buffer, pool.v_buffer):
        k.normal_()
        v.normal_()
    return pool


def tiers(pool, directory: str) -> Tiers:
    storage = Storage("file", {"file_storage_path": directory}, "bench", timeout=10)
    assert storage.connected(), storage.stats()
    return Tiers(pool, PAGE, storage=storage)


def slots(first_page: int, pages: int) -> torch.Tensor:
    return torch.arange(first_page * PAGE, (first_page + pages) * PAGE)


def on_thread(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def measure(config: dict, chunks: int, chunk_pages: int, reps: int) -> dict[str, float]:
    pool = kv_pool(config, 2 * chunks * chunk_pages + 2)
    keys = [f"chunk-{i}" for i in range(chunks)]
    n = chunk_pages * PAGE
    source = [slots(1 + i * chunk_pages, chunk_pages) for i in range(chunks)]
    dest = [slots(1 + (chunks + i) * chunk_pages, chunk_pages) for i in range(chunks)]
    with tempfile.TemporaryDirectory() as directory:
        writer = tiers(pool, directory)
        for key, src in zip(keys, source):
            writer.persist(key, src)
        assert writer.storage.drain()
        reader = tiers(pool, directory)
        figures: dict[str, list[float]] = {}

        def add(name, ms):
            figures.setdefault(name, []).append(ms)

        for _ in range(reps):
            def sync_plan():
                for key, d in zip(keys, dest):
                    reader.place(sync_fetch(reader, key, n), d)
            add("sync fetch+place", on_thread(sync_plan))
            add("sync fetch, no room", on_thread(lambda: [sync_fetch(reader, key, n) for key in keys]))

            reader.clear_host()  # forget what earlier repetitions fetched
            started = time.perf_counter()
            add("want (round 1)", on_thread(lambda: [reader.want(key, n) for key in keys]))
            while any(reader.poll(key, n) == PENDING for key in keys):
                time.sleep(0.0002)
            add("background wait", (time.perf_counter() - started) * 1e3)
            add("want, no room", on_thread(lambda: [reader.want(key, n) for key in keys]))

            def ready_plan():
                for key, d in zip(keys, dest):
                    assert reader.want(key, n) == "storage"
                    reader.place(reader.take(key, n), d, key=key)
            add("want+take+place (ready)", on_thread(ready_plan))
        assert all(torch.equal(a, b) for a, b in zip((reader.device.gather(d) for d in dest),
                                                      (reader.device.gather(s) for s in source)))
        assert reader.stats()["storage_rejected"] == 0 and reader.stats()["storage_unavailable_misses"] == 0
        return {name: statistics.median(ms) for name, ms in figures.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--chunk-pages", default="4,32")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    config = json.loads((Path(args.model) / "config.json").read_text())
    sizes = [int(p) for p in args.chunk_pages.split(",")]
    results = {p: measure(config, args.chunks, p, args.reps) for p in sizes}
    layers, heads, head_dim, dtype = kv_shape(config)
    token_bytes = 2 * layers * heads * head_dim * dtype.itemsize
    print(f"{args.model}: {args.chunks} chunks from file storage, page {PAGE}, {token_bytes} B of KV per token; "
          f"median of {args.reps} requests, ms on the scheduler thread")
    header = "| | " + " | ".join(f"{p} pages/chunk ({args.chunks * p * PAGE * token_bytes / 1024:.0f} KiB)"
                                  for p in sizes) + " |"
    print(header)
    print("|---" * (len(sizes) + 1) + "|")
    for name in results[sizes[0]]:
        print(f"| {name} | " + " | ".join(f"{results[p][name]:.3f}" for p in sizes) + " |")


if __name__ == "__main__":
    main()
