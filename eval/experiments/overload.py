"""What a server's log says about one loaded point: batches, step times, forward, retractions.

    .venv/bin/python -m eval.experiments.overload                      # vanilla and mepic, HotpotQA, reuse 0.85, 7 chunks, QPS 8
    .venv/bin/python -m eval.experiments.overload --systems mepic --qps 16 --requests 300
    .venv/bin/python -m eval.experiments.overload --systems vanilla,vanilla-page16,mepic-attention,full --qps 4 --requests 300

For each system it starts a fresh server as eval.experiments.run does (the 4-layer tiny
model, a pool of 16,384 pages, the same host tier for the position-independent
systems), sends the first `--requests` of eval.experiments.run's paper workload (seed 0) at
`--qps`, and prints TTFT, e2e and the prefill forward (p50, from SGLang's
meta_info as eval.experiments.run reads it) beside what SGLang logged: the prefill batches
(requests and new tokens per batch, median) and, every 4 decode steps, the
running batch (median, max), the generation rate (SGLang's, which also counts
prefill batches run between two logs), the decode step it implies (running /
rate, median) and whether any request was retracted.

Besides eval.experiments.run's systems, two that take `full` apart one difference at a time
(vanilla: torch_native attention, SGLang's radix cache, pages of 1 token; full:
mepic attention, the mepic radix cache, pages of 16):
- vanilla-page16: vanilla with pages of 16 tokens;
- mepic-attention: the mepic attention backend with SGLang's radix cache and pages
  of 16 (no chunk layout: every row takes the plain path).
"""

import argparse
import re
import statistics
from pathlib import Path

from tqdm import tqdm
from transformers import AutoTokenizer

from eval.experiments.run import (DEFAULT_HOST_TIER_GB, PAPER_POOL_PAGES, SYSTEMS, context_args, run_point, serve, tiered,
                                  ttft_parts)
from eval.lib import served
from eval.lib.workloads import render, with_reuse
from sglang_mepic.launch import models
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE

VARIANTS = {
    "vanilla-page16": [*SYSTEMS["vanilla"], "--page-size", str(MEPIC_PAGE_SIZE)],
    "mepic-attention": ["--attention-backend", "mepic", "--radix-cache-backend", "sglang",
                        "--page-size", str(MEPIC_PAGE_SIZE)],
}
CHOICES = {**SYSTEMS, **VARIANTS}
DECODE = re.compile(r"Decode batch, #running-req: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")
PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+)")


def median(values, default=0.0):
    return statistics.median(values) if values else default


def report(system: str, outputs: list, seconds: float, log: str | None) -> str:
    """One line: the client's figures, then what the server's log says (None: no log, --url)."""
    parts = [p for p in map(ttft_parts, outputs) if p is not None]
    client = (f"{system}: {len(outputs)} requests in {seconds:.1f} s; TTFT p50 {median([o[3] for o in outputs]):.3f} s, "
              f"e2e p50 {median([o[4] for o in outputs]):.2f} s; queue p50 {median([p[1] for p in parts]):.3f} s, "
              f"forward p50 {median([p[2] for p in parts]):.3f} s")
    if log is None:
        return client + "; the server's log not read (--url: a server this command did not start)"
    prefills = [(int(n), int(t)) for n, t in PREFILL.findall(log)]
    steps = [(int(n), float(rate)) for n, rate in DECODE.findall(log)]
    step_ms = [1000 * n / rate for n, rate in steps if rate > 0]
    return (f"{client}; prefill batches {len(prefills)}, requests "
            f"{median([n for n, _ in prefills]):g} and new tokens {median([t for _, t in prefills]):g} per batch "
            f"(median); running batch median {median([n for n, _ in steps]):g}, max "
            f"{max((n for n, _ in steps), default=0)}; decode step {median(step_ms):.1f} ms (median of running / "
            f"rate); generation tok/s max {max((r for _, r in steps), default=0):.0f}; retraction lines "
            f"{len(re.findall('etract', log))}")


def measure(system: str, model: str, extra: list, env: dict, texts: list[str], qps: float,
            url: str | None = None) -> tuple:
    """One system on a fresh server (or the one at `url`): (outputs, seconds, the log lines of the run or None)."""
    flags, _ = tiered(system, CHOICES[system], DEFAULT_HOST_TIER_GB)
    with serve(model, extra, flags, env, MEPIC_PAGE_SIZE, url) as (server, pool):
        mark = len(server.log())
        outputs, _, _, seconds, _ = run_point(server, MEPIC_PAGE_SIZE, pool, texts, qps, 16, 0, tqdm(disable=True))
        return outputs, seconds, None if url else server.log()[mark:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(CHOICES))
    ap.add_argument("--dataset", default="hotpotqa")
    ap.add_argument("--qps", type=float, default=8.0)
    ap.add_argument("--requests", type=int, default=150, help="the first N of eval.experiments.run's 300-request workload")
    ap.add_argument("--reuse", type=float, default=0.85)
    ap.add_argument("--chunks", type=int, default=7)
    ap.add_argument("--model", default=None, help=f"HF model folder (default: {models.EVAL_MODEL}, as eval.experiments.run --paper)")
    ap.add_argument("--pool-pages", type=int, default=PAPER_POOL_PAGES)
    served.add_url(ap)
    args = ap.parse_args()
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in CHOICES]
    if unknown or not 0 < args.requests <= 300 or args.pool_pages < 64:
        raise SystemExit(f"bad arguments: systems {unknown or 'ok'}, --requests {args.requests} (1-300), "
                         f"--pool-pages {args.pool_pages} (at least 64)")

    model = str(Path(args.model).resolve()) if args.model else str(models.build(models.EVAL_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [render(tokenizer, r) for r in with_reuse(args.dataset, 300, args.chunks, args.reuse)[:args.requests]]
    counts = {(args.chunks, args.reuse): [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]}
    extra, env = context_args(model, counts, MEPIC_PAGE_SIZE, 16)
    extra += ["--max-total-tokens", str(args.pool_pages * MEPIC_PAGE_SIZE)]
    print(f"[overload] {args.dataset}, {len(texts)} requests x {args.chunks} chunks, reuse {args.reuse:g}, "
          f"QPS {args.qps:g}, model {Path(model).name}, "
          + (f"the server at {args.url} (--url)" if args.url else f"pool {args.pool_pages:,} pages"))
    for system in systems:
        print(report(system, *measure(system, model, extra, env, texts, args.qps, args.url)), flush=True)


if __name__ == "__main__":
    main()
