"""The defaults the wrapper fills in where the user gave no flag: the mepic backends and page size, metrics
and cache reports, and on a machine without CUDA the CPU engine, a bounded pool, float32 where bf16 is
emulated and each tensor- or data-parallel rank's cores."""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sglang_mepic.launch import models
from sglang_mepic.launch.sglang_flags import ATTENTION_BACKEND, MEPIC_PAGE_SIZE, SGLANG_CACHE, known_flags, sglang_argv

CPU_MAX_TOTAL_TOKENS = 65536  # SGLang would otherwise size the pool from free RAM (~14 GB)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether the CPU computes bf16 natively (AVX512-BF16 or AMX); None where it cannot be told.

    Without it, torch emulates bf16 matmuls: issue 17 measured a 1,784-token
    prompt on SmolLM2-135M at 21.6 s in bf16 and 3.8 s in float32 (AVX2 only).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags")
             for flag in line.split(":", 1)[1].split()}
    if not flags:
        return None
    return bool(flags & {"avx512_bf16", "amx_bf16"})


# Extends with at least this much work (tokens x hidden size) take every core: their ops run long enough that a
# thread waiting for a core costs little against what the second core adds. SmolLM2-135M (hidden 576): from
# 456 tokens (a lone 928-token prompt took 1.33 s on one thread of 2 cores, 0.83 s on both); tiny-4l (128):
# from 2,048, more than a request of the capacity runs recomputes.
LONG_EXTEND_WORK = 2**18


@dataclass
class CpuThreads:
    """The torch threads a CPU server's scheduler runs each forward with.

    The tokenizer, the detokenizer and the HTTP server run beside the scheduler. Where its threads take
    every core, a parallel op waits at OpenMP's barrier for a thread another process holds: with one of
    2 cores busy, a decode's 128x256 linear took 142 against 5.6 us and its attention 419 against 56 us
    (tiny-4l's shapes). So decodes and short extends leave a core to them: a tiny-4l mepic server at
    6 req/s over an fp8 pool spent 162 ms of CPU a request rather than 288, TTFT p50 0.19 against 0.74 s
    (one thread for every forward: 143 against 270 ms; over bf16 at 3 req/s, 221 against 446). A long
    extend takes every core: SmolLM2-135M's lone 3,351-token prompt took 4.7 s, 5.9-7.1 s on one
    thread of 2 cores and 3.8-4.1 s on both. (SGLang's scheduler runs one thread on a GPU for the same
    reason, `ModelRunner.load_model`.) The count an extend gets depends on its batch, not its result: the
    model's ops (linear, SDPA, RMSNorm, softmax at SmolLM2's shapes, 1 to 2,000 tokens) gave the same
    bits on 1 thread and 2.
    """

    every: int  # torch's count when the scheduler started
    fewer: int  # one core left
    hidden_size: int
    current: int

    @classmethod
    def plan(cls, environ: Mapping[str, str], cpus: int, current: int, hidden_size: int) -> "CpuThreads | None":
        """None where the count stays torch's: the user's own (OMP_NUM_THREADS, SGLang's
        SGLANG_CPU_OMP_THREADS_BIND), or no core to leave.

        With SGLANG_CPU_OMP_THREADS_BIND (tensor parallelism: the launcher's or the user's), each rank runs as
        many threads as the fewest cores it names for a rank, where torch runs more: SGLang binds the threads
        only on CPUs with AMX or on arm64, and elsewhere every rank ran a thread per core of the machine. Two
        ranks of the tiny model on 2 cores, 16 requests of 16 tokens: 31-45 s with 2 threads a rank, 6.5-7.1 s
        with 1."""
        if environ.get("OMP_NUM_THREADS"):
            return None
        if bind := environ.get("SGLANG_CPU_OMP_THREADS_BIND"):
            per_rank = min(_cores_named(group) for group in bind.split("|"))
            return cls(per_rank, per_rank, hidden_size, current) if 0 < per_rank < current else None
        fewer = max(1, min(current, cpus) - 1)
        return cls(current, fewer, hidden_size, current) if fewer < current else None

    @property
    def long_extend_tokens(self) -> int:
        """The fewest tokens of an extend that takes every core."""
        return -(-LONG_EXTEND_WORK // self.hidden_size)

    def for_forward(self, extend: bool, tokens: int) -> int | None:
        """The count this forward runs with, or None where it is the one set now."""
        want = self.every if extend and tokens >= self.long_extend_tokens else self.fewer
        if want == self.current:
            return None
        self.current = want
        return want


def _cores_named(group: str) -> int:
    """How many cores one rank's SGLANG_CPU_OMP_THREADS_BIND entry names ("0-3", "0,2,4", "5"); 0 where it
    cannot be read."""
    count = 0
    for part in group.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            return 0
        count += int(last) - int(first) + 1 if dash else 1
    return count


def _without_flag(argv: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        elif not a.startswith(flag + "="):
            out.append(a)
    return out


def cpu_threads_bind(ranks: int, cpus: list[int] | None = None) -> str:
    """SGLANG_CPU_OMP_THREADS_BIND for `ranks` CPU ranks: this process's cores in as many contiguous groups,
    one a rank ("0|1" for 2 ranks on 2 cores, "0-1|2-3" on 4). Unset, SGLang binds each rank to a NUMA node
    of its own and asserts there are as many nodes as ranks (`numa_utils.init_threads_binding`), which a
    one-node machine is not. With fewer cores than ranks, ranks share cores (core i % count)."""
    cores = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cores) < ranks:
        return "|".join(str(cores[i % len(cores)]) for i in range(ranks))
    share, extra = divmod(len(cores), ranks)
    groups, at = [], 0
    for rank in range(ranks):
        group = cores[at:at + share + (rank < extra)]
        at += len(group)
        contiguous = group == list(range(group[0], group[-1] + 1))
        groups.append(f"{group[0]}-{group[-1]}" if contiguous and len(group) > 1 else ",".join(map(str, group)))
    return "|".join(groups)


def with_defaults(argv: list[str], cuda: bool, native_bf16: bool | None = None,
                  environ: Mapping[str, str] | None = None) -> tuple[list[str], dict[str, str]]:
    """Return (argv, env) with the defaults filled in where the user gave none.

    native_bf16: whether the CPU has native bf16 (default: read from /proc/cpuinfo); environ: the
    environment the server will run with (default: this process's), where a variable of the user's wins.
    """
    environ = os.environ if environ is None else environ
    argv = sglang_argv(argv)  # a default is given only where the user gave the flag in no spelling
    known = known_flags(argv)
    env = {"HF_HUB_OFFLINE": "1"}  # nothing may download from a model hub
    if known.model_path is None:
        argv += ["--model-path", str(models.model_dir(models.DEFAULT_MODEL))]
    if known.radix_cache_backend == SGLANG_CACHE:
        argv = _without_flag(argv, "--radix-cache-backend")
    elif known.radix_cache_backend is None and (known.attention_backend or ATTENTION_BACKEND) == "mepic":
        argv += ["--radix-cache-backend", "mepic"]
        known.radix_cache_backend = "mepic"
    if known.radix_cache_backend == "mepic" and known.page_size is None:
        argv += ["--page-size", str(MEPIC_PAGE_SIZE)]
    if known.attention_backend is None:
        argv += ["--attention-backend", ATTENTION_BACKEND]
    if not known.enable_metrics:
        argv += ["--enable-metrics"]  # /metrics, with the chunk cache's figures
    if not known.enable_cache_report:
        argv += ["--enable-cache-report"]  # OpenAI usage reports cached prompt tokens
    if (known.attention_backend or ATTENTION_BACKEND) == "mepic" and not cuda \
            and known.cuda_graph_backend_decode is None:
        # No CUDA here: nothing to capture. On CUDA the mepic backend captures decode graphs, and prefill
        # runs under SGLang's default breakable prefill graphs: the backend's captured-metadata hooks write
        # planned positions into the graph's static positions buffer (attention/backend.py).
        argv += ["--cuda-graph-backend-decode", "disabled"]
    if known.enable_priority_scheduling and known.default_priority_value is None:
        # SGLang only warns here, then a request sent without a priority ends the scheduler the
        # first time preemption sorts the running batch (None * int): it gets the neutral 0.
        argv += ["--default-priority-value", "0"]
    # SGLang's CPU ranks: a scheduler for each TP rank of each DP replica, bound to entry dp_rank * tp + tp_rank.
    ranks = known.tp_size * known.dp_size
    if (not cuda or known.device == "cpu") and ranks > 1 and not environ.get("SGLANG_CPU_OMP_THREADS_BIND"):
        env["SGLANG_CPU_OMP_THREADS_BIND"] = cpu_threads_bind(ranks)  # each CPU rank its own cores
    if not cuda:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if known.device is None:
            argv += ["--device", "cpu"]
        if known.max_total_tokens is None:
            argv += ["--max-total-tokens", str(CPU_MAX_TOTAL_TOKENS)]
        if known.dtype is None and (native_bf16 if native_bf16 is not None else cpu_has_native_bf16()) is False:
            argv += ["--dtype", "float32"]  # emulated bf16 is several times slower than float32
        if not known.sleep_on_idle:
            # An idle scheduler otherwise spins a whole core of a small CPU machine.
            argv += ["--sleep-on-idle"]
    return argv, env
