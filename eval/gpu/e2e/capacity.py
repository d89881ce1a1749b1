"""eval.experiments.capacity on the device (issue 71): the highest arrival rate each system serves within its SLO when the KV
pool, not the forward, is what fills. The same search, probes, SLO logic and report as eval.experiments.capacity, against
drive.py's 8B-shaped model and servers (vanilla: SGLang's triton backend and radix cache), with the prompts
rendered here into the carry (capacity.json.xz). One device call runs one part, a workload for one or two systems:

    set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 1   # SQuAD, 2,048 pages: vanilla, mepic (timeout_s 590)
    set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 2   # SQuAD, 2,048 pages: epic-16-host, epic-16
    set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 3   # long prompts, 4,352 pages: epic-16, mepic
    set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 4   # long prompts, 4,352 pages: vanilla, epic-16-host
    set -o pipefail; bash eval/gpu/e2e/run.sh capacity --part 5   # SQuAD, 2,048 bf16 pages' bytes (4,096 fp8
                                                                  # pages): vanilla-fp8, mepic-fp8 (issue 73)

The parts are ranked as the issue asks: SQuAD at the memory-bound pool first, then the long prompts. A call's
cells land in $OUT/capacity-<workload>/; the next call goes on from them when they travel back with the tree
(`--resume-from DIR`: DIR's cells.jsonl and invocations.jsonl are copied into --out first), so a workload's
table gathers its systems over calls. A probe that could end past `--budget` is not started, nor a server that
would be up too late for one (the cells finished so far are kept). Without CUDA, the dry run of the same steps
on a tiny model (float32, torch_native for vanilla), which the test suite makes:

    bash eval/gpu/e2e/run.sh capacity --cpu --part 1 --requests 12 --max-probes 1
"""

import math
import os
import shutil
import sys
import time
from pathlib import Path

from eval.experiments import capacity
from eval.gpu.e2e import drive
from eval.gpu.e2e.workload import CAPACITY, read_capacity
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE
from sglang_mepic.process.server_process import ServerProcess

# epic-16-host (EPIC's chunks in host memory, as on LMCache's CPU backend) is the private-copy baseline read
# first, so it leads part 2 and joins vanilla in part 4; epic-16 (its store in the pool) follows it.
PARTS = {1: ("squad", ("vanilla", "mepic")), 2: ("squad", ("epic-16-host", "epic-16")), 3: ("long", ("epic-16", "mepic")),
         4: ("long", ("vanilla", "epic-16-host")), 5: ("squad", ("vanilla-fp8", "mepic-fp8"))}
# fp8 KV (issue 73): SGLang's own triton backend and mepic over an e4m3 cache. Part 5 reads its pool as bytes
# (--equal-bytes): part 1's bf16 pool holds twice its pages in fp8, so its cells sit beside part 1's.
FP8_VARIANTS = {"vanilla-fp8": ("vanilla", "fp8_e4m3"), "mepic-fp8": ("mepic", "fp8_e4m3")}
# What a device call is given unless the command line says otherwise: 128 new tokens a request (the issue's), one
# seed a call, no matched concurrency, at most 6 probes a cell (two systems' starts, ~2 min each, leave ~5 min).
DEVICE_DEFAULTS = {"new_tokens": 128, "seeds": "0", "matched": "", "max_probes": 6, "max_rate": 256.0}
BUDGET_S = {"device": 540.0, "cpu": 900.0}  # the call's limit is 600 s, the install takes ~26 s of it
# A server's start as the budget counts it: 65-131 s on the H200 (2026-11-27, drive.py's servers), and a first probe.
SERVER_START_S = {"device": 170.0, "cpu": 40.0}


def parser():
    ap = capacity.parser(__doc__)
    # requests and start rate: the workload's own unless given.
    ap.set_defaults(**DEVICE_DEFAULTS, requests=None, start_rate=None, out=Path(os.environ.get("OUT", "/tmp/e2e_out")))
    ap.add_argument("--part", type=int, choices=sorted(PARTS), required=True, help="the workload and systems of a call")
    ap.add_argument("--carry", type=Path, default=drive.ROOT / ".gpu_e2e")
    ap.add_argument("--resume-from", type=Path, help="a folder of an earlier call's cells to go on from")
    ap.add_argument("--cpu", action="store_true", help="the dry run without CUDA: tiny model, float32")
    ap.add_argument("--shape", choices=sorted(drive.SHAPES), default=None, help="default: llama3-8b (tiny with --cpu)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the call's probes (default "
                    f"{BUDGET_S['device']:g}; --cpu {BUDGET_S['cpu']:g})")
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--graph-max-bs", type=int, default=128)
    ap.add_argument("--jit", action="store_true", help="SGLang's compiled fused-op kernels (drive.py --jit)")
    return ap


def context_length(prompt_tokens: list[int], chunks: int, new_tokens: int) -> int:
    """A power of two that holds the longest prompt padded (a page more a chunk at most) and its new tokens."""
    longest = max(prompt_tokens) + MEPIC_PAGE_SIZE * chunks + new_tokens
    return max(8192, 1 << math.ceil(math.log2(longest)))


def server_of(system: str, args, pool: int, length: int) -> tuple[list[str], list[str], dict]:
    """drive.py's server for a system (its flags, the common ones, env); an fp8 variant is its base system's
    over an fp8 cache, given the pages its bytes hold (--equal-bytes)."""
    base, dtype = FP8_VARIANTS.get(system, (system, None))
    pages = capacity.pool_pages_for(system, pool, args.equal_bytes, args.dtype, FP8_VARIANTS)
    flags, common, env = drive.server_args(base, args, pages, length)
    return ([*flags, "--kv-cache-dtype", dtype] if dtype else flags), common, env


def main(argv=None) -> None:
    began = time.time()
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    name, systems = PARTS[args.part]
    work = CAPACITY[name]
    carried = read_capacity(args.carry / "capacity.json.xz")[name]
    # The workload fixes what the prompts are; the pool defaults to the one it binds at.
    args.dataset, args.chunks, args.reuse = work.dataset, work.chunks, work.reuse
    args.systems = args.systems or ",".join(systems)
    args.pools = args.pools or str(work.pool_pages)
    args.requests = min(args.requests or work.requests, carried["requests"])
    args.start_rate = args.start_rate or work.start_rate
    args.dtype, args.sync_debug = ("float32" if args.cpu else "bfloat16"), ""
    args.out = args.out / f"capacity-{name}"
    args.equal_bytes = args.equal_bytes or any(s in FP8_VARIANTS for s in args.systems.split(","))
    todo = capacity.plan(args, FP8_VARIANTS)
    missing = [s for s in todo.seeds if str(s) not in carried["texts"]]
    if missing:
        raise SystemExit(f"the carry has no prompts of seeds {missing} for {name} (it has {sorted(carried['texts'])})")
    if args.resume_from:
        args.out.mkdir(parents=True, exist_ok=True)
        for f in ("cells.jsonl", "invocations.jsonl"):
            if (args.resume_from / f).is_file():
                shutil.copy(args.resume_from / f, args.out / f)
        args.resume = True

    device = drive.device_info(args.cpu)
    shape = args.shape or ("tiny" if args.cpu else "llama3-8b")
    model = drive.model_dir(args.cpu)
    written = drive.write_model(model, args.carry / "model", shape, args.dtype, "cpu" if args.cpu else "cuda")
    tokens = [n for s in todo.seeds for n in carried["prompt_tokens"][str(s)]]
    length = context_length(tokens, work.chunks, args.new_tokens)
    drive.log(f"device {device.get('name')}; capacity part {args.part}: {name} ({work.dataset}, {work.chunks} chunks, "
              f"{args.requests} requests a probe), systems {todo.systems}, pools {todo.pools}, seeds {todo.seeds}; "
              f"model {shape} {args.dtype} (checksum {written.get('checksum')}); context {length}")

    def prepare(seeds):
        texts = {s: carried["texts"][str(s)][:args.requests] for s in seeds}

        def make_server(system, pool):
            flags, common, env = server_of(system, args, pool, length)
            return ServerProcess(model, *flags, *common, startup_timeout=args.startup_timeout, env=env)
        return texts, make_server

    budget = args.budget or BUDGET_S["cpu" if args.cpu else "device"]
    commit = (args.carry / "COMMIT").read_text().strip() if (args.carry / "COMMIT").is_file() else "?"
    note = (f"device {device.get('name')}, model {shape} {args.dtype} (weights checksum {written.get('checksum')}), "
            f"commit {commit}, capacity part {args.part} (eval.gpu.e2e.capacity)")
    capacity.run(args, argv, todo, f"{shape} ({name})", prepare, deadline=began + budget, note=note,
                 module="eval.gpu.e2e.capacity", machine=device.get("name"),
                 server_start_s=SERVER_START_S["cpu" if args.cpu else "device"])
    drive.log(f"done in {time.time() - began:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
