"""Per-call cost of the cache's bookkeeping against the pool's size.

    .venv/bin/python -m eval.bench.cache [--sizes 1000,10000,100000] [--calls 20]

For each size, a cache on SGLang's real paged allocator (page size 16) is filled
through the scheduler's calls (tests/support/replay.py) until it holds that many cached
pages: half plain requests of 8 pages sharing a 2-page prefix, half requests of
4 stored chunks (4 pages each) plus prompt. SGLang's `RadixCache` is filled with
the same requests, chunk markup removed, and asked `evictable_size` once (the
scheduler asks it at every step as the cache fills, which the replay does not: the
first question would otherwise settle every page the fill touched). Then each call
is timed (mean of `--calls`, or their median with `--median`, in ms):

- evictable_size: what SGLang's scheduler asks several times per step;
- recount: the same figure counted from scratch (the mepic cache's oracle, and its
  cost before the ledger);
- stats: the figures /metrics and /server_info publish;
- match+plan: a request of 8 stored chunks matched again (planning included), as the scheduler matches a
  request at each round it waits, its chunks where they were;
- first match: a new request of the same 8 chunks, seen and matched for the first time (its chunk keys
  hashed, planned, matched), a request each call;
- evict 1%: evicting 1% of the cached pages (5 calls);
- release: a finished request cached and released, then evictable_size. The first
  follows the evictions: a page they touched and left for the next question to
  settle would be paid here;
- step sample: the figures sampled after a decode step that allocated a page (the
  prepare_for_decode hook), with SGLang's multiprocess Prometheus files as its server
  has them; and "published", the same sample made to publish /metrics, as every such
  step did before busy samples published at most every 0.5 s (issue 88).
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
# As a server with metrics has it: the gauges write to files shared by its processes, which is what a set costs.
os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="mepic-bench-metrics-"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from tqdm import tqdm  # noqa: E402

from support.oracle import recount_freeable  # noqa: E402
from support.replay import (B, apply_hooks, cached_pages, chunked, compiled, finish, laid_out, make_tree,  # noqa: E402
                            new_request, plain_ids, planned, replanned, serve)


def strip(lay) -> list[int]:
    return list(lay.real_tokens())


class Filler:
    """Sends requests until the cache holds the pages asked for; alternates plain and chunked."""

    def __init__(self, tree, mepic: bool):
        self.tree, self.mepic, self.i, self.next_chunk = tree, mepic, 0, 0

    def cached_pages(self) -> int:
        return cached_pages(self.tree)

    def send(self):
        tree, i = self.tree, self.i
        self.i += 1
        if i % 2 == 0:
            serve(tree, plain_ids(i), None)
            return
        chunks = list(range(self.next_chunk, self.next_chunk + 4))
        self.next_chunk += 4
        lay = chunked(i, chunks)
        if self.mepic:
            for seg in lay.chunks:
                serve(tree, *compiled(seg))
            serve(tree, *laid_out(lay))
        else:
            serve(tree, strip(lay), None)

    def fill(self, pages: int, label: str):
        with tqdm(total=pages, desc=label, unit="page", leave=False) as bar:
            while (n := self.cached_pages()) < pages:
                self.send()
                bar.update(n - bar.n)


AVERAGE = statistics.mean  # or statistics.median (--median)


def timed(fn, calls: int) -> float:
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return AVERAGE(times) * 1e3


def measure(size: int, mepic: bool, calls: int) -> dict[str, float | None]:
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    tree = make_tree(num_pages=int(size * 1.25) + 64, sglang=not mepic)
    filler = Filler(tree, mepic)
    filler.fill(size, f"{'mepic' if mepic else 'sglang'} {size}")
    tree.evictable_size()  # what the scheduler's steps would have asked as it filled
    out: dict[str, float | None] = {"cached pages": filler.cached_pages()}
    out["evictable_size"] = timed(tree.evictable_size, calls)
    out["recount"] = timed(lambda: recount_freeable(tree), max(1, calls // 4)) if mepic else None
    out["stats"] = timed(tree.report.stats, calls) if mepic else None

    # a request of 8 chunks that are all stored, matched (and planned) as the scheduler does
    big = chunked(-1, list(range(8)))
    if mepic:
        for seg in big.chunks:
            serve(tree, *compiled(seg))
        req = new_request(*laid_out(big))

        def match():
            replanned(tree, req)
            tree.residency.end_round()
    else:
        req = new_request(strip(big), None)

        def match():
            replanned(tree, req)
    out["match+plan"] = timed(match, calls)

    def first_match():
        fresh = new_request(*laid_out(big)) if mepic else new_request(strip(big), None)
        t = time.perf_counter()
        replanned(tree, fresh)
        if mepic:
            tree.residency.end_round()
        return time.perf_counter() - t

    out["first match"] = AVERAGE([first_match() for _ in range(calls)]) * 1e3

    one_percent = max(1, size // 100) * B
    out["evict 1%"] = timed(lambda: tree.evict(EvictParams(num_tokens=one_percent)), 5)

    def release():
        args = (*laid_out(chunked(filler.i, [0, 1, 2, 3])),) if mepic else (plain_ids(filler.i), None)
        filler.i += 1
        req = planned(tree, *args)
        t = time.perf_counter()
        finish(tree, req)
        tree.evictable_size()
        return time.perf_counter() - t

    out["release"] = AVERAGE([release() for _ in range(calls)]) * 1e3
    out["step sample"] = step_sample(tree, calls, publish=False) if mepic else None
    out["published"] = step_sample(tree, calls, publish=True) if mepic else None
    return out


def step_sample(tree, calls: int, publish: bool) -> float:
    """ms of `report.sample()` after a decode step's page allocation; `publish`: as if the last publish were
    more than PUBLISH_EVERY_S ago."""
    allocator, report, times = tree.token_to_kv_pool_allocator, tree.report, []
    report.sample()
    for _ in range(calls):
        slots = allocator.alloc(B)
        if publish:  # the counts moved since the last publish, which was long enough ago
            report.publish_at_next_sample()
        t = time.perf_counter()
        report.sample()
        times.append(time.perf_counter() - t)
        if slots is not None:
            allocator.free(slots)
    return AVERAGE(times) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="cached pages (comma-separated)")
    ap.add_argument("--calls", type=int, default=20, help="calls timed per figure")
    ap.add_argument("--median", action="store_true", help="the median of the calls rather than their mean")
    args = ap.parse_args()
    global AVERAGE
    if args.median:
        AVERAGE = statistics.median
    apply_hooks()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = {}
    for size in sizes:
        rows[size] = (measure(size, True, args.calls), measure(size, False, args.calls))
    names = ["evictable_size", "recount", "stats", "match+plan", "first match", "evict 1%", "release", "step sample", "published"]
    stat = "median" if args.median else "mean"
    print(f"\nms per call, {stat} of {args.calls} (evict: of 5); page size {B}; mepic / SGLang RadixCache\n")
    print("| cached pages | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for size, (m, s) in rows.items():
        cells = []
        for n in names:
            a, b = m[n], s[n]
            cells.append(f"{a:.3f}" if b is None else f"{a:.3f} / {b:.3f}")
        print(f"| {m['cached pages']:,} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
