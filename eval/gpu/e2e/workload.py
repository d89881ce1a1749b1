"""The requests the GPU end-to-end run sends, rendered here so the device needs no dataset.

    .venv/bin/python -m eval.gpu.e2e.workload --tokenizer models/smollm2-135m --out .gpu_e2e/workload.json \
        --capacity-out .gpu_e2e/capacity.json.xz

The SQuAD paper workload of eval.experiments.run (7 chunks a request, reuse 0.85) as chat text with MEPIC's chunk
markup, rendered with SmolLM2's tokenizer (the one the device's 8B-shaped model uses), plus a few
fixed prompts for the correctness checks: the same documents at different positions, so `full`,
vanilla and `--mepic-recompute-blocks all` are compared where position-independent reuse matters.
"""

import argparse
import json
import lzma
from dataclasses import asdict, dataclass
from pathlib import Path

from eval.experiments import capacity
from eval.experiments.run import PAPER
from eval.lib.workloads import render, reuse_ratio, with_reuse

REQUESTS = 300
CHECKS = 8  # prompts whose first-token distributions are compared across systems


@dataclass(frozen=True)
class CapacityWorkload:
    """A workload of the device's capacity runs (eval/gpu/e2e/capacity.py) and the pool it binds at."""
    dataset: str
    chunks: int
    reuse: float
    requests: int    # a probe's requests (the most rendered per seed)
    pool_pages: int  # where KV memory binds on the device before the forward does
    start_rate: float


# issue 71: SQuAD as the paper's base point at a pool that 128 new tokens a request fill (vanilla holds about 22
# requests of ~1.3k tokens, SmolLM2's tokenizer); long prompts (16 documents of 400-600 tokens, 7.8k-9k tokens) at a pool that holds
# about 8 of them whole. squad-long has 355 documents: 120 requests draw 16 x 120 x 0.15 ~ 290 new ones.
CAPACITY = {"squad": CapacityWorkload("squad", 7, 0.85, 300, 2048, 8.0),
            "long": CapacityWorkload("squad-long", 16, 0.85, 120, 4352, 2.0)}
CAPACITY_SEEDS = (0, 1, 2)


def build(tokenizer_dir: str, requests: int = REQUESTS, dataset: str = "squad") -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    base = PAPER["base"]
    reqs = with_reuse(dataset, requests, base["chunks"], base["reuse"])
    texts = [render(tokenizer, r) for r in reqs]
    tokens = [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    # The checks: requests that repeat documents seen earlier, so reusing systems read stored chunks
    # at positions other than those they were computed at.
    seen, checks = set(), []
    for i, r in enumerate(reqs):
        if any(d in seen for d in r.docs) and len(checks) < CHECKS:
            checks.append(i)
        seen.update(r.docs)
    return {"dataset": dataset, "chunks": base["chunks"], "reuse": base["reuse"],
            "reuse_ratio_tokens": round(reuse_ratio(reqs, lambda d: tokenizer.encode(d, add_special_tokens=False)), 3),
            "tokenizer": Path(tokenizer_dir).name, "texts": texts, "prompt_tokens": tokens,
            "answers": [list(r.answers) for r in reqs], "checks": checks}


def build_capacity(tokenizer_dir: str, seeds=CAPACITY_SEEDS, requests: int | None = None) -> dict:
    """Each capacity workload's prompts per seed (as eval.experiments.capacity renders them) with their token counts."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = {}
    for name, w in CAPACITY.items():
        n = min(requests or w.requests, w.requests)
        counted = capacity.rendered(tokenizer, w.dataset, n, w.chunks, w.reuse, seeds)
        out[name] = {**asdict(w), "requests": n,  # JSON keys: seeds as text
                     "texts": {str(seed): [t for t, _ in ts] for seed, ts in counted.items()},
                     "prompt_tokens": {str(seed): [k for _, k in ts] for seed, ts in counted.items()}}
    return out


def write_capacity(path: Path, workloads: dict) -> None:
    """xz: the documents repeat across requests (reuse 0.85), so the prompts pack about 30x."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(lzma.compress(json.dumps(workloads).encode(), preset=6))


def read_capacity(path: Path) -> dict:
    return json.loads(lzma.decompress(path.read_bytes()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="models/smollm2-135m", help="a folder with the tokenizer's files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--dataset", default="squad", choices=["squad", "hotpotqa"])
    ap.add_argument("--capacity-out", type=Path, help="also the capacity runs' prompts (capacity.json.xz)")
    ap.add_argument("--capacity-seeds", default=",".join(map(str, CAPACITY_SEEDS)))
    ap.add_argument("--capacity-requests", type=int, default=None, help="at most this many a seed (default: each "
                    "workload's own)")
    args = ap.parse_args(argv)
    if args.requests < CHECKS:
        raise SystemExit(f"--requests must be at least {CHECKS}")
    workload = build(args.tokenizer, args.requests, args.dataset)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(workload))
    tokens = sorted(workload["prompt_tokens"])
    print(f"[workload] {len(tokens)} requests of {workload['chunks']} chunks ({workload['dataset']}), "
          f"reuse {workload['reuse_ratio_tokens']:.2f} by tokens, prompt tokens median {tokens[len(tokens) // 2]} "
          f"max {tokens[-1]}, checks {workload['checks']} -> {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    if args.capacity_out:
        seeds = [int(x) for x in args.capacity_seeds.split(",")]
        capacity = build_capacity(args.tokenizer, seeds, args.capacity_requests)
        write_capacity(args.capacity_out, capacity)
        for name, w in capacity.items():
            counts = sorted(n for ts in w["prompt_tokens"].values() for n in ts)
            print(f"[workload] capacity {name}: {w['requests']} requests x seeds {seeds} of {w['chunks']} chunks "
                  f"({w['dataset']}), prompt tokens {counts[0]}-{counts[-1]}")
        print(f"[workload] -> {args.capacity_out} ({args.capacity_out.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
