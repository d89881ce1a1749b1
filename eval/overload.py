"""What a server's log says about one overloaded point: running batch, generation rate, retractions.

    .venv/bin/python -m eval.overload                      # HotpotQA, reuse 0.85, 7 chunks, QPS 8, 150 requests
    .venv/bin/python -m eval.overload --systems mepic --qps 16 --requests 300

The README's "why the decode phase is long at QPS 8" reads these figures. For
each system it starts a fresh server as eval.run does, sends the first
`--requests` of eval.run's paper workload at `--qps`, and prints TTFT and e2e
p50 beside what SGLang logged every 4 decode steps: the running batch (median,
max), the generation rate (SGLang's, which also counts prefill batches run
between two logs) and whether any request was retracted.
"""

import argparse
import re
import statistics
from pathlib import Path

from tqdm import tqdm
from transformers import AutoTokenizer

from eval.run import SYSTEMS, context_args, run_point
from eval.workloads import render, with_reuse
from sglang_mepic.launch_server import MEPIC_PAGE_SIZE
from sglang_mepic.server_process import ServerProcess

DECODE = re.compile(r"Decode batch, #running-req: (\d+),.*gen throughput \(token/s\): ([0-9.]+)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--dataset", default="hotpotqa")
    ap.add_argument("--qps", type=float, default=8.0)
    ap.add_argument("--requests", type=int, default=150, help="the first N of eval.run's 300-request workload")
    ap.add_argument("--reuse", type=float, default=0.85)
    ap.add_argument("--chunks", type=int, default=7)
    ap.add_argument("--model", default="models/tiny")
    args = ap.parse_args()
    unknown = [s for s in args.systems.split(",") if s not in SYSTEMS]
    if unknown or not 0 < args.requests <= 300:
        raise SystemExit(f"bad arguments: systems {unknown or 'ok'}, --requests {args.requests} (1-300)")

    model = str(Path(args.model).resolve())
    tokenizer = AutoTokenizer.from_pretrained(model)
    texts = [render(tokenizer, r) for r in with_reuse(args.dataset, 300, args.chunks, args.reuse)[:args.requests]]
    counts = {(args.chunks, args.reuse): [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]}
    extra, env = context_args(model, counts, MEPIC_PAGE_SIZE, 16)
    for system in args.systems.split(","):
        with ServerProcess(model, "--dtype", "float32", "--decode-log-interval", "4", *extra, *SYSTEMS[system],
                           startup_timeout=600, env=env) as server:
            mark = len(server.log())
            outputs, _, _, seconds = run_point(server, MEPIC_PAGE_SIZE, texts, args.qps, 16, 0, tqdm(disable=True))
            log = server.log()[mark:]
        steps = [(int(n), float(rate)) for n, rate in DECODE.findall(log)]
        running = [n for n, _ in steps]
        print(f"{system}: {len(texts)} requests in {seconds:.1f} s; TTFT p50 {statistics.median(o[3] for o in outputs):.2f} s, "
              f"e2e p50 {statistics.median(o[4] for o in outputs):.2f} s; running batch median "
              f"{statistics.median(running) if running else 0:g}, max {max(running, default=0)}; generation "
              f"tok/s max {max((r for _, r in steps), default=0):.0f} (top 3 as (running, tok/s): "
              f"{sorted(steps, key=lambda s: -s[1])[:3]}); retraction lines {len(re.findall('etract', log))}")


if __name__ == "__main__":
    main()
