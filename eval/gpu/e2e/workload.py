"""The requests the GPU end-to-end run sends, rendered here so the device needs no dataset.

    .venv/bin/python -m eval.gpu.e2e.workload --tokenizer models/smollm2-135m --out .gpu_e2e/workload.json

The SQuAD paper workload of eval.run (7 chunks a request, reuse 0.85) as chat text with MEPIC's chunk
markup, rendered with SmolLM2's tokenizer (the one the device's 8B-shaped model uses), plus a few
fixed prompts for the correctness checks: the same documents at different positions, so `full`,
vanilla and `--mepic-recompute-blocks all` are compared where position-independent reuse matters.
"""

import argparse
import json
from pathlib import Path

from eval.run import PAPER
from eval.workloads import render, reuse_ratio, with_reuse

REQUESTS = 300
CHECKS = 8  # prompts whose first-token distributions are compared across systems


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


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", default="models/smollm2-135m", help="a folder with the tokenizer's files")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--dataset", default="squad", choices=["squad", "hotpotqa"])
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


if __name__ == "__main__":
    main()
