"""What a prefill forward costs against the tokens it computes: its fixed part and its per-token part.

    .venv/bin/python -m eval.forward_cost [--model models/smollm2-135m] [--systems vanilla,mepic]
                                          [--tokens 16,64,128,256,512,1024] [--repeats 5] [--poll-metrics]

One server per system (eval.run's flags, float32). Requests go one at a time, so
each prefill is alone in its batch: prompts of random token ids (a fresh draw per
request, so no prefix is cached), one new token. The forward is SGLang's
`prefill_finished_time - forward_entry_time` (what eval.run reports as forward).
Prints its p50 per prompt length and the least-squares line forward = a + b * tokens:
`a` is the cost that does not shrink when reuse cuts the tokens computed, and
bounds what any reuse can do to a prefill's latency on this machine.

`--poll-metrics` also polls `/metrics` ten times a second meanwhile, as eval.run's
KV sampler does during its points: on 2 cores what the server's HTTP process
spends on it is taken from the forward's threads.
"""

import argparse
import json
import random
import statistics
from pathlib import Path

import requests

from eval.run import SYSTEMS, Sampler
from sglang_mepic import models
from sglang_mepic.server_process import ServerProcess


def forward(server, ids: list[int]) -> float:
    """One request alone: its forward in seconds."""
    r = requests.post(server.url + "/generate", timeout=600, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    r.raise_for_status()
    meta = r.json()["meta_info"]
    return meta["prefill_finished_time"] - meta["forward_entry_time"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--tokens", default="16,64,128,256,512,1024", help="comma-separated prompt lengths")
    ap.add_argument("--repeats", type=int, default=5, help="requests per length (after one warm-up request)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--poll-metrics", action="store_true", help="poll /metrics at 10 Hz meanwhile, as eval.run does")
    args = ap.parse_args(argv)
    systems, lengths = args.systems.split(","), [int(n) for n in args.tokens.split(",")]
    if unknown := [s for s in systems if s not in SYSTEMS]:
        raise SystemExit(f"bad arguments: unknown systems {unknown}")
    if args.repeats < 1 or min(lengths) < 1 or len(set(lengths)) < 2:
        raise SystemExit(f"bad arguments: --repeats {args.repeats}, --tokens {args.tokens} (each at least 1; "
                         "two lengths or more, to fit a line)")
    model = str(Path(args.model).resolve()) if args.model else str(models.build(models.DEFAULT_MODEL))
    rng = random.Random(args.seed)
    vocab = json.loads((Path(model) / "config.json").read_text())["vocab_size"]
    low, high = min(1000, vocab // 2), min(20000, vocab)  # ordinary tokens, within any vocabulary
    print(f"model {Path(model).name}, float32, one request at a time, 1 new token, {args.repeats} per length"
          + (", /metrics polled at 10 Hz meanwhile" if args.poll_metrics else ""))
    print("| system | " + " | ".join(f"{n} tok" for n in lengths) + " | fixed a (s) | per token b (ms) |")
    print("|---|" + "---|" * (len(lengths) + 2))
    for system in systems:
        with ServerProcess(model, "--dtype", "float32", *SYSTEMS[system], startup_timeout=600) as server:
            forward(server, [rng.randrange(low, high) for _ in range(lengths[0])])  # warm-up
            sampler = Sampler(server.url, page_size=1)
            if args.poll_metrics:
                sampler.start()
            xs, ys, cells = [], [], []
            for n in lengths:
                times = [forward(server, [rng.randrange(low, high) for _ in range(n)])
                         for _ in range(args.repeats)]
                xs += [n] * len(times)
                ys += times
                cells.append(f"{statistics.median(times):.3f}")
            sampler.stop.set()
            b, a = statistics.linear_regression(xs, ys)
            print(f"| {system} | " + " | ".join(cells) + f" | {a:.3f} | {b * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
