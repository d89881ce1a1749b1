"""How fast this machine's CPU is today: one fixed piece of float32 work on one thread, in ms.

Sessions run on machines that are named alike ("Intel(R) Xeon(R) Processor", 2 cores) but are not alike:
on 2026-12-04 epic-16's TPOT p50 at capacity at 512 pages was 5.4 ms where on 2026-12-03 it had been about
16 ms, with nearly the same code for it. So a figure from one session paired with a figure from another compares
machines as much as systems. Each capacity invocation records this probe beside its load average,
so a reader can see whether two runs shared a machine's speed, and pairs only those that did.
"""

import statistics
import time

SIZE, REPEATS, SAMPLES = 384, 24, 5


def probe_ms() -> float:
    """The median of SAMPLES timings of REPEATS products of two SIZE x SIZE float32 matrices, on one thread
    (the thread count restored): about 17 ms on the machine of 2026-12-04; larger is slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.randn(SIZE, SIZE, generator=gen), torch.randn(SIZE, SIZE, generator=gen)
        a @ b  # the first product pays for the kernel's setup
        times = []
        for _ in range(SAMPLES):
            t = time.perf_counter()
            for _ in range(REPEATS):
                a @ b
            times.append(time.perf_counter() - t)
    finally:
        torch.set_num_threads(threads)
    return round(statistics.median(times) * 1e3, 2)
