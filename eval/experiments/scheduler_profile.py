"""Where SGLang's scheduler spends its busy time: inside the model forward or outside it.

    .venv/bin/python -m eval.experiments.scheduler_profile                       # vanilla and mepic, HotpotQA, QPS 8, 150 requests
    .venv/bin/python -m eval.experiments.scheduler_profile --requests 300 --out eval/results/profile-after.txt
    .venv/bin/python -m eval.experiments.scheduler_profile --from-raw /tmp/prof  # re-read the raw profiles a run kept (--raw-dir)
    .venv/bin/python -m eval.experiments.scheduler_profile --systems vanilla,mepic,vanilla,mepic,vanilla,mepic  # 3 interleaved pairs

For each system it starts a fresh server as eval.experiments.run does, sends the first
`--requests` of eval.experiments.run's paper workload (reuse 0.85, 7 chunks, 16 new tokens,
greedy) at `--qps` as eval.experiments.run does, and samples SGLang's scheduler process
(`sglang::scheduler`) with py-spy from just before the first request until the
last reply: `py-spy record --format raw --idle --full-filenames --rate R`.
py-spy attaches with ptrace (root, or CAP_SYS_PTRACE, or ptrace_scope 0).
py-spy is not free on 2 cores: it pauses the process for each sample and takes CPU
from the other processes of the server, and OpenMP's threads then wait for each other.
Read shares, not absolute times, and not thread-count effects: tiny-4l's scheduler
at QPS 1.2 over an fp8 pool was busy 27 samples a request with 2 OpenMP threads and
16 with 1 under py-spy, while unprofiled the two served within 10% of each other
(e2e p50 0.155 and 0.141 s; 2026-11-30).

Each sample is one stack. Only the scheduler's main thread counts: a stack that
passes through `Scheduler.event_loop_normal` or `Scheduler.event_loop_overlap`;
other threads' samples are counted and left out. A main-thread sample is

- idle when it passes through `Scheduler.on_idle`: SGLang's branch for a loop
  turn with no batch to run, its housekeeping and, with `--sleep-on-idle` (the
  launcher's CPU default), the poll that waits for the next request;
- forward when it passes through `ModelRunner.forward`
  (sglang/srt/model_executor/model_runner.py): the model's layers, the
  attention backend's per-batch metadata and kernels (MEPIC's attention path
  included); prefill and decode apart (`EagerRunner._execute_extend` /
  `_execute_decode` on CPU, `ModelRunner.forward_extend` / `forward_decode`);
- outside the forward otherwise: receiving requests, choosing the next batch
  (prefix matching, MEPIC's planning and admission), preparing it, sampling,
  processing results, freeing.

Busy = forward + outside; every share printed is of busy samples. The top
functions outside the forward count a function once per sample it is on
(inclusive), pass-through decorators (SGLang's stage-metrics and NVTX
wrappers, the HookRegistry wrapper, torch's no-grad decorator) left out;
`[mepic]` marks this project's code (files under sglang_mepic/ outside
site-packages). For this project's functions the list also
gives their own share: samples whose innermost project frame is the function
with no SGLang frame below it (its own Python and the torch/stdlib calls it
makes; a hook's time inside the SGLang function it wraps is SGLang's). The
folders the project's sampled code came from are printed, so a run against
another checkout (PYTHONPATH) shows which code it profiled. The last line is
mepic's outside-forward share over vanilla's against the target ratio.

A system named more than once is profiled once per mention, each on a fresh
server (raw files `<system>.txt`, `<system>#2.txt`, ...). The k-th vanilla run
and the k-th mepic run are a pair: the verdict gives each pair's ratio and
their median and range; the function lists are of each system's runs pooled.
"""

import argparse
import datetime
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tqdm import tqdm

import sglang_mepic
from eval.experiments.run import DEFAULT_HOST_TIER_GB, PAPER, SYSTEMS, context_args, run_point, serve, tiered
from eval.lib import provenance
from eval.lib.workloads import render, with_reuse
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE

# Issue 47's target: mepic's share of busy scheduler time outside the forward at most this times vanilla's.
TARGET_RATIO = 1.2
NEW_TOKENS = 16  # eval.experiments.run's default
MAIN_LOOP = ("Scheduler.event_loop_normal", "Scheduler.event_loop_overlap")
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
MEPIC_FILE = re.compile(r"^(?P<root>.*)/(?P<top>sglang_mepic)/(?:[^/]+/)*[^/]+\.py$")
SCHEDULER_FILE = "sglang/srt/managers/scheduler.py"
MODEL_RUNNER_FILE = "sglang/srt/model_executor/model_runner.py"
SGLANG_FILE = "site-packages/sglang/"
# Pass-through decorators on every path they wrap: listed, they would only repeat the share of what they wrap.
WRAPPERS = (("scheduler_stage_method.<locals>.decorator.<locals>.wrapper", "observability/scheduler_stage_metrics.py"),
            ("profile_method.<locals>.decorator.<locals>.wrapper", "utils/nvtx_utils.py"),
            ("_wrap_fn.<locals>.wrapper", "plugins/hook_registry.py"),
            ("context_decorator.<locals>.decorate_context", "torch/utils/_contextlib.py"))
# How ModelRunner.forward runs a batch, by forward mode: SGLang's eager runner (CPU) and ModelRunner's own methods.
PREFILL = (("EagerRunner._execute_extend", "model_executor/runner/eager_runner.py"),
           ("ModelRunner.forward_extend", MODEL_RUNNER_FILE))
DECODE = (("EagerRunner._execute_decode", "model_executor/runner/eager_runner.py"),
          ("ModelRunner.forward_decode", MODEL_RUNNER_FILE))


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @property
    def mepic(self) -> bool:
        return "site-packages" not in self.file and MEPIC_FILE.match(self.file) is not None

    def short(self) -> str:
        """The file after site-packages/ (SGLang) or from this project's package folder on."""
        if "site-packages/" in self.file:
            return self.file.split("site-packages/", 1)[1]
        m = MEPIC_FILE.match(self.file)
        return self.file[len(m.group("root")) + 1:] if m else self.file

    def is_(self, qualname: str, file_suffix: str) -> bool:
        """py-spy names a function by its qualified name on Python 3.11+, by its bare name before."""
        return self.function in (qualname, qualname.rsplit(".", 1)[-1]) and self.file.endswith(file_suffix)


def parse_frame(text: str) -> Frame:
    m = FRAME.match(text)
    return Frame(m.group("function"), m.group("file")) if m else Frame(text, "")


def parse_raw(raw: str) -> list[tuple[list[Frame], int]]:
    """py-spy's raw format: one `outermost;...;innermost count` line per distinct stack."""
    stacks = []
    for line in raw.splitlines():
        if line.strip():
            stack, count = line.rsplit(" ", 1)
            stacks.append(([parse_frame(f) for f in stack.split(";")], int(count)))
    return stacks


@dataclass
class Split:
    """The scheduler main thread's samples, by class (see the module docstring)."""
    other_threads: int = 0
    idle: int = 0
    prefill: int = 0
    decode: int = 0
    forward_other: int = 0  # ModelRunner.forward in neither forward_extend nor forward_decode (idle batches)
    outside: int = 0
    outside_functions: Counter = field(default_factory=Counter)  # Frame -> outside samples it is on
    own: Counter = field(default_factory=Counter)  # project Frame -> outside samples it spent itself (own_frame)
    mepic_folders: Counter = field(default_factory=Counter)  # folder of a sampled project file -> samples

    @property
    def forward(self) -> int:
        return self.prefill + self.decode + self.forward_other

    @property
    def busy(self) -> int:
        return self.forward + self.outside

    def share(self, n: int) -> float:
        return n / self.busy if self.busy else float("nan")

    def __add__(self, other: "Split") -> "Split":
        return Split(*(getattr(self, f) + getattr(other, f) for f in self.__dataclass_fields__))


def labels(systems: list[str]) -> list[tuple[str, str]]:
    """(label, system) per run: the system's name at its first mention, `<system>#k` at its k-th."""
    seen = Counter()
    runs = []
    for system in systems:
        seen[system] += 1
        runs.append((system if seen[system] == 1 else f"{system}#{seen[system]}", system))
    return runs


def pooled(runs: list[tuple[str, str]], splits: dict[str, Split]) -> dict[str, Split]:
    """Each system's runs summed into one Split, in order of first mention."""
    out: dict[str, Split] = {}
    for label, system in runs:
        out[system] = out[system] + splits[label] if system in out else splits[label]
    return out


def classify(stacks: list[tuple[list[Frame], int]]) -> Split:
    split = Split()
    for frames, n in stacks:
        loop = next((i for i, f in enumerate(frames) if any(f.is_(name, SCHEDULER_FILE) for name in MAIN_LOOP)),
                    None)
        if loop is None:
            split.other_threads += n
            continue
        for folder in {"{root}/{top}".format(**MEPIC_FILE.match(f.file).groupdict()) for f in frames if f.mepic}:
            split.mepic_folders[folder] += n
        below = frames[loop + 1:]
        if any(f.is_("Scheduler.on_idle", SCHEDULER_FILE) for f in below):
            split.idle += n
        elif any(f.is_("ModelRunner.forward", MODEL_RUNNER_FILE) for f in below):
            if any(f.is_(*way) for f in below for way in PREFILL):
                split.prefill += n
            elif any(f.is_(*way) for f in below for way in DECODE):
                split.decode += n
            else:
                split.forward_other += n
        else:
            split.outside += n
            for f in set(below):
                split.outside_functions[f] += n
            if (own := own_frame(below)) is not None:
                split.own[own] += n
    return split


def own_frame(frames: list[Frame]) -> Frame | None:
    """The project function a sample's time is this project's own cost in: the innermost project frame,
    unless SGLang code runs below it (a hook around an SGLang function: the time is SGLang's)."""
    for f in reversed(frames):
        if f.mepic:
            return f
        if SGLANG_FILE in f.file:
            return None
    return None


def listed(split: Split) -> Counter:
    """The functions outside the forward worth listing: all but the pass-through decorators."""
    return Counter({f: n for f, n in split.outside_functions.items() if not any(f.is_(*w) for w in WRAPPERS)})


def differences(splits: dict[str, Split], top: int) -> list[str]:
    """Where mepic's outside-forward time exceeds vanilla's: the functions with the largest gap in share."""
    if "vanilla" not in splits or "mepic" not in splits:
        return []
    mepic, vanilla = splits["mepic"], splits["vanilla"]
    gap = {f: mepic.share(n) - vanilla.share(vanilla.outside_functions[f]) for f, n in listed(mepic).items()}
    lines = ["largest gaps outside the forward, mepic - vanilla (inclusive, points of busy samples):"]
    for frame in sorted(gap, key=gap.get, reverse=True)[:top]:
        lines.append(f"  {gap[frame]:+6.1%}  {'[mepic] ' if frame.mepic else ''}{frame.function}  ({frame.short()})")
    return lines


def report(system: str, split: Split, top: int) -> list[str]:
    s = split
    lines = [f"{system}: {s.busy + s.idle:,} main-thread samples ({s.idle:,} idle, left out; "
             f"{s.other_threads:,} of other threads, left out); busy {s.busy:,}",
             f"  busy scheduler time: forward {s.share(s.forward):.1%} (prefill {s.share(s.prefill):.1%}, "
             f"decode {s.share(s.decode):.1%}, other {s.share(s.forward_other):.1%}); "
             f"outside the forward {s.share(s.outside):.1%}",
             f"  top functions outside the forward (inclusive, % of busy samples; [mepic] = this project's code):"]
    for frame, n in listed(s).most_common(top):
        lines.append(f"    {s.share(n):6.1%}  {'[mepic] ' if frame.mepic else ''}{frame.function}  ({frame.short()})")
    ours = Counter({f: n for f, n in s.outside_functions.items() if f.mepic})
    lines.append(f"  this project's own code outside the forward: {s.share(sum(s.own.values())):.1%} of busy samples; "
                 f"its functions (inclusive / own, % of busy samples; own: the innermost project frame, with no "
                 f"SGLang code below it):")
    for frame, n in ours.most_common(top):
        lines.append(f"    {s.share(n):6.1%} / {s.share(s.own[frame]):5.1%}  {frame.function}  ({frame.short()})")
    if not ours:
        lines.append("    none sampled")
    folders = ", ".join(f"{d} ({n:,} samples)" for d, n in s.mepic_folders.most_common()) or "none sampled"
    lines.append(f"  this project's code ran from: {folders}")
    return lines


def verdict(runs: list[tuple[str, str]], splits: dict[str, Split]) -> list[str]:
    """mepic's outside-forward share over vanilla's, per pair of runs (the k-th of each) and their median."""
    vanilla = [splits[label] for label, system in runs if system == "vanilla"]
    mepic = [splits[label] for label, system in runs if system == "mepic"]
    if not vanilla or not mepic:
        return ["no ratio: profile both vanilla and mepic for it"]
    lines, ratios = [], []
    for k, (m, v) in enumerate(zip(mepic, vanilla), 1):
        ms, vs = m.share(m.outside), v.share(v.outside)
        ratios.append(ms / vs if vs else float("inf"))
        lines.append(f"pair {k}: outside-forward share of busy scheduler time: mepic {ms:.1%} / vanilla {vs:.1%} "
                     f"= {ratios[-1]:.2f}x")
    if len(mepic) != len(vanilla):
        lines.append(f"unpaired: {abs(len(mepic) - len(vanilla))} run(s) of "
                     f"{'mepic' if len(mepic) > len(vanilla) else 'vanilla'} left out of the ratio")
    ratio = statistics.median(ratios)
    spread = f" (range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} pairs)" if len(ratios) > 1 else ""
    lines.append(f"outside-forward share, mepic / vanilla: median {ratio:.2f}x{spread} "
                 f"(target <= {TARGET_RATIO:g}x: {'met' if ratio <= TARGET_RATIO else 'missed'})")
    return lines


def scheduler_pid(server) -> int:
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if child.cmdline() and child.cmdline()[0].startswith("sglang::scheduler"):
                return child.pid
        except psutil.NoSuchProcess:
            continue
    raise RuntimeError(f"no sglang::scheduler process under the server (pid {server.proc.pid})")


class PySpy:
    """`py-spy record` of one process into a raw file, from start() until stop()."""

    def __init__(self, pid: int, out: Path, rate: int):
        exe = Path(sys.executable).with_name("py-spy")
        exe = str(exe) if exe.exists() else shutil.which("py-spy")
        if exe is None:
            raise SystemExit("py-spy not found: install the eval extra (pip install py-spy)")
        self.cmd = [exe, "record", "--pid", str(pid), "--format", "raw", "--idle", "--full-filenames",
                    "--rate", str(rate), "--output", str(out)]
        self.proc: subprocess.Popen | None = None
        self.summary = ""

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = self.proc.stdout.readline()  # "py-spy> Sampling process ..." once attached
        if "Sampling" not in first:
            rest = self.proc.stdout.read()
            self.proc.wait()
            raise RuntimeError(f"py-spy did not attach ({' '.join(self.cmd)}):\n{first}{rest}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)  # py-spy writes its file on Ctrl-C
        output, _ = self.proc.communicate(timeout=60)
        self.summary = next((line for line in output.splitlines() if "Samples:" in line), "").strip()


def profile(system: str, model: str, extra: list[str], env: dict, texts: list[str], qps: float, new_tokens: int,
            raw: Path, rate: int, bar: tqdm) -> tuple[float, str]:
    """Serve `texts` on a fresh server of `system` under py-spy; returns (seconds, py-spy's summary line)."""
    bar.set_postfix_str(f"{system}: starting server")
    flags, _ = tiered(system, SYSTEMS[system], DEFAULT_HOST_TIER_GB)
    with serve(model, extra, flags, env, MEPIC_PAGE_SIZE) as (server, pool):
        spy = PySpy(scheduler_pid(server), raw, rate)
        spy.start()
        try:
            bar.set_postfix_str(f"{system}: QPS {qps:g}")
            _, _, _, seconds, _ = run_point(server, MEPIC_PAGE_SIZE, pool, texts, qps, new_tokens, 0, bar)
        finally:
            spy.stop()
    return seconds, spy.summary


def workload(model: str, dataset: str, requests: int) -> tuple[list[str], list[str], dict]:
    """The first `requests` of eval.experiments.run's paper workload: texts, server flags and environment."""
    from transformers import AutoTokenizer

    base = PAPER["base"]
    tokenizer = AutoTokenizer.from_pretrained(model)
    reqs = with_reuse(dataset, PAPER["requests"], base["chunks"], base["reuse"])[:requests]
    texts = [render(tokenizer, r) for r in reqs]
    counts = {(base["chunks"], base["reuse"]): [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]}
    extra, env = context_args(model, counts, MEPIC_PAGE_SIZE, NEW_TOKENS)
    return texts, extra, env


def how_it_ran(argv: list[str]) -> list[str]:
    """Command, date, machine and the commit of the code the servers import."""
    root = Path(sglang_mepic.__file__).resolve().parent.parent
    git = ["git", "-C", str(root)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "sglang_mepic"],
                           capture_output=True, text=True).stdout.strip()
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    path = f"PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])} " if os.environ.get("PYTHONPATH") else ""
    where = "" if Path.cwd().resolve() == provenance.ROOT else f" (in {Path.cwd()})"
    code = "this checkout" if root == provenance.ROOT else str(root)
    return [f"command: {path}{provenance.command('eval.experiments.scheduler_profile', argv)}{where}",
            f"date: {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}",
            f"machine: {platform.node()}, {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            f"code: {code} at {commit or 'unknown commit'}"
            + (" with uncommitted changes in sglang_mepic/" if dirty else "")]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--dataset", default="hotpotqa")
    ap.add_argument("--qps", type=float, default=8.0)
    ap.add_argument("--requests", type=int, default=150,
                    help=f"the first N of eval.experiments.run's {PAPER['requests']}-request paper workload")
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15, help="functions listed per system")
    ap.add_argument("--model", default="models/tiny")
    ap.add_argument("--raw-dir", type=Path, default=None, help="keep py-spy's raw profiles here (<system>.txt)")
    ap.add_argument("--from-raw", type=Path, default=None,
                    help="no servers: classify the raw profiles a run kept in this folder (--raw-dir)")
    ap.add_argument("--out", type=Path, default=None, help="also write the report, with its provenance, here")
    args = ap.parse_args(argv)
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown or not 0 < args.requests <= PAPER["requests"] or args.qps <= 0:
        raise SystemExit(f"bad arguments: systems {unknown or 'ok'}, --requests {args.requests} "
                         f"(1-{PAPER['requests']}), --qps {args.qps} (> 0)")

    lines = how_it_ran(argv)
    runs = labels(systems)
    splits = {}
    if args.from_raw:
        lines.append(f"raw profiles read from: {args.from_raw}")
        for label, _ in runs:
            splits[label] = classify(parse_raw((args.from_raw / f"{label}.txt").read_text()))
    else:
        model = str(Path(args.model).resolve())
        texts, extra, env = workload(model, args.dataset, args.requests)
        lines.append(f"workload: {args.dataset}, the first {len(texts)} of eval.experiments.run's paper workload "
                     f"({PAPER['base']['chunks']} chunks, reuse {PAPER['base']['reuse']:g}, {NEW_TOKENS} new tokens, "
                     f"greedy), QPS {args.qps:g}, model {Path(model).name} float32; py-spy at {args.rate} Hz")
        raw_dir = args.raw_dir or Path(tempfile.mkdtemp(prefix="mepic-profile-"))
        raw_dir.mkdir(parents=True, exist_ok=True)
        with tqdm(total=len(runs) * len(texts), desc="requests", unit="req") as bar:
            for label, system in runs:
                raw = raw_dir / f"{label}.txt"
                seconds, summary = profile(system, model, extra, env, texts, args.qps, NEW_TOKENS, raw,
                                           args.rate, bar)
                lines.append(f"{label}: {len(texts)} requests served in {seconds:.1f} s; {summary}")
                splits[label] = classify(parse_raw(raw.read_text()))
        if args.raw_dir is None:
            shutil.rmtree(raw_dir)
        else:
            lines.append(f"raw profiles: {raw_dir}")
    if len(runs) > len(set(systems)):
        lines.append("per run (busy samples; outside-forward share):")
        lines += [f"  {label}: {splits[label].busy:,}; {splits[label].share(splits[label].outside):.1%}"
                  for label, _ in runs]
        lines.append("each system's runs pooled below:")
    by_system = pooled(runs, splits)
    for system, split in by_system.items():
        lines += report(system, split, args.top)
    lines += differences(by_system, args.top)
    lines += verdict(runs, splits)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
