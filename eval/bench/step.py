"""The scheduler's time outside the forward per decode step, mepic against vanilla (SGLang's radix cache).

    .venv/bin/python -m eval.bench.step [--batches 16,64] [--short 24 --long 120] [--rounds 3]

On a GPU a decode step of an 8B model takes about 7.5 ms (H200, batch 1), so what the scheduler
spends in Python around each step (choosing the batch, MEPIC's hooks, processing results, freeing)
shows directly in decode speed. This measures it on the CPU, where it is the same Python.

Both servers run at once (eval.experiments.run's flags, float32, a pool that holds every prompt
whole) and are driven in turn, so their rounds are paired in time. For each batch size B, the
first B prompts of the paper workload (SQuAD, 7 chunks, reuse 0.85) are sent once to warm the
cache; then each round sends the same B at once twice, with `--short` and `--long` new tokens
(ignore_eos), in alternating order. Between two runs the server idles 1.2 s and serves one
1-token request: SGLang's per-stage counters (`sglang:scheduler_stage_seconds_total`) are
recorded once a second by its loop, and the request makes it record what came before.

Each run's prefill (cached prompts), its ramp and its tail are the same at both lengths, so the
difference of the two runs is `--long` - `--short` decode steps of the whole batch: its
`run_batch` seconds over the decode passes it added (`sglang:cuda_graph_passes_total`,
its decode modes) are the forward per step, and its other busy stages (idle left out) the
time outside the forward per step. Prints both, median and range over rounds, each stage's share, and
mepic / vanilla per round paired (target of issue 88: outside the forward <= 1.1). What a
request's end costs that grows with its output (caching and freeing its generated tokens) is in
the difference too, spread over the steps.

With `--url` the one server there is measured (one system only: a ratio of a server to itself
would read as one).
"""

import argparse
import contextlib
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from eval.experiments.capacity import loadavg
from eval.experiments.capacity_probe import scheduler_counters_of
from eval.experiments.capacity_report import busy_seconds, fmt
from eval.experiments.run import SYSTEMS, context_args, server_process, stream
from eval.lib import served
from eval.lib.workloads import render, with_reuse
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE

DECODE_PASSES = 'sglang:cuda_graph_passes_total{'
# SGLang's radix cache at mepic's page size: the servers differ in the page size as well as in MEPIC (vanilla runs
# SGLang's default of 1 token a page), and SGLang's own paged allocation costs the scheduler time a decode step.
BENCH_SYSTEMS = {**SYSTEMS, "vanilla-p16": SYSTEMS["vanilla"] + ["--page-size", str(MEPIC_PAGE_SIZE)]}
TARGET = 1.1


def counters(url: str) -> dict:
    """The scheduler's stage seconds (eval.experiments.capacity reads them) and its decode passes, from /metrics."""
    text = requests.get(url + "/metrics", timeout=30).text
    passes = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                 if line.startswith(DECODE_PASSES) and 'mode="decode_' in line)
    return {"stages": scheduler_counters_of(text)["stages"], "decode_passes": passes}


def settle(url: str) -> dict:
    """Idle past SGLang's 1-s accounting interval, then one 1-token request, so the counters hold all before."""
    time.sleep(1.2)
    requests.post(url + "/generate", timeout=120, json={
        "text": "tick", "sampling_params": {"max_new_tokens": 1, "temperature": 0}}).raise_for_status()
    return counters(url)


def run(url: str, texts: list[str], tokens: int) -> dict:
    """The texts at once, `tokens` new tokens each; what the scheduler's counters moved by."""
    before = settle(url)
    with ThreadPoolExecutor(len(texts)) as pool:
        outputs = list(pool.map(lambda t: stream(url, t, tokens, ignore_eos=True), texts))
    if any(meta.get("completion_tokens") != tokens for _, _, meta, *_ in outputs):
        raise SystemExit(f"step: a request did not generate its {tokens} tokens")
    after = settle(url)
    stages = {k: v - before["stages"].get(k, 0.0) for k, v in after["stages"].items()}
    busy = busy_seconds(stages)
    return {"passes": after["decode_passes"] - before["decode_passes"], "forward": stages.get("run_batch", 0.0),
            "outside": busy - stages.get("run_batch", 0.0), "stages": stages}


def per_step(short: dict, long: dict) -> dict:
    """ms a decode step of the whole batch: the two runs' difference."""
    steps = long["passes"] - short["passes"]
    if steps <= 0:
        raise SystemExit(f"step: the long run added no decode passes ({short['passes']} then {long['passes']})")
    stages = {k: 1e3 * (v - short["stages"].get(k, 0.0)) / steps for k, v in long["stages"].items() if k != "idle"}
    return {k: 1e3 * (long[k] - short[k]) / steps for k in ("forward", "outside")} | {"steps": steps, "stages": stages}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="models/tiny-4l")
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(BENCH_SYSTEMS))
    ap.add_argument("--batches", default="16,64", help="comma-separated decode batch sizes")
    ap.add_argument("--short", type=int, default=24, help="new tokens of the short run")
    ap.add_argument("--long", type=int, default=120, help="new tokens of the long run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    served.add_url(ap)
    args = ap.parse_args(argv)
    systems, batches = args.systems.split(","), [int(b) for b in args.batches.split(",")]
    if unknown := [s for s in systems if s not in BENCH_SYSTEMS]:
        raise SystemExit(f"bad arguments: unknown systems {unknown}")
    if args.url and len(systems) > 1:
        raise SystemExit("bad arguments: --url measures the one server there; give one --systems")
    if min(batches) < 1 or not 1 <= args.short < args.long or args.rounds < 1:
        raise SystemExit("bad arguments: batches >= 1, 1 <= --short < --long, --rounds >= 1")
    model = str(Path(args.model).resolve())
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [render(tokenizer, r) for r in with_reuse("squad", max(batches), 7, 0.85, args.seed)]
    counts = [len(tokenizer(t).input_ids) for t in texts]
    extra, env = context_args(model, {(7, 0.85): counts}, MEPIC_PAGE_SIZE, args.long)
    pool = 2 * (sum(counts) + max(batches) * (args.long + 8 * MEPIC_PAGE_SIZE))  # all of it cached, whole
    extra += ["--max-total-tokens", str(pool), "--max-running-requests", str(max(batches) + 2)]
    print(f"model {Path(model).name}, float32, squad 7 chunks reuse 0.85, prompts {min(counts)}-{max(counts)} tokens, "
          f"decode steps = {args.long} - {args.short} new tokens, {args.rounds} rounds; load {loadavg()} before",
          flush=True)
    results: dict = {(s, b): [] for s in systems for b in batches}
    with contextlib.ExitStack() as stack:  # every server started is stopped, whatever fails
        urls = [stack.enter_context(served.Running(args.url) if args.url
                                    else server_process(model, extra, BENCH_SYSTEMS[s], env)).url for s in systems]
        for b in batches:
            for url in urls:
                run(url, texts[:b], args.short)  # warms the cache (chunks stored, prefixes cached)
            for r in range(args.rounds):
                order = list(zip(systems, urls))
                for system, url in (order if r % 2 == 0 else order[::-1]):
                    lengths = [args.short, args.long] if r % 2 == 0 else [args.long, args.short]
                    got = {n: run(url, texts[:b], n) for n in lengths}
                    results[system, b].append(per_step(got[args.short], got[args.long]))
                    print(f"[step] batch {b} round {r} {system}: {results[system, b][-1]}", file=sys.stderr, flush=True)
    print("| system | batch | decode steps a round | forward ms a step | outside the forward ms a step |")
    print("|---|---|---|---|---|")
    for b in batches:
        for s in systems:
            rows = results[s, b]
            print(f"| {s} | {b} | {fmt([x['steps'] for x in rows], '{:.0f}')} | {fmt([x['forward'] for x in rows])} | "
                  f"{fmt([x['outside'] for x in rows])} |")
    for b in batches:  # where the time outside the forward goes: SGLang's stages, ms a step
        names = sorted({k for s in systems for x in results[s, b] for k in x["stages"]} - {"run_batch"})
        print(f"\nbatch {b}, ms a decode step by scheduler stage:\n\n| stage | " + " | ".join(systems) + " |")
        print("|---|" + "---|" * len(systems))
        for name in names:
            print(f"| {name} | " + " | ".join(fmt([x["stages"].get(name, 0.0) for x in results[s, b]])
                                             for s in systems) + " |")
    print()
    for base in ("vanilla", "vanilla-p16"):
        if "mepic" not in systems or base not in systems:
            continue
        for b in batches:
            ratios = [m["outside"] / v["outside"] for m, v in zip(results["mepic", b], results[base, b])]
            verdict = "met" if statistics.median(ratios) <= TARGET else "missed"
            print(f"batch {b}: outside the forward a decode step, mepic / {base}: {fmt(ratios)} "
                  f"(per round; target <= {TARGET}" + (f": {verdict})" if base == "vanilla" else ", read against "
                                                      "vanilla: this row separates SGLang's paged cost)"))
    print(f"load {loadavg()} after")


if __name__ == "__main__":
    main()
