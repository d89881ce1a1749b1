"""What finding registered documents in an unmarked prompt costs (frontend/known_texts.py).

    .venv/bin/python -m eval.bench.known_lookup                 # 10,000 documents; prompts of 1k, 8k, 32k tokens
    .venv/bin/python -m eval.bench.known_lookup --docs 100000

Registers `--docs` SQuAD-sized documents (paragraphs of the bundled SQuAD set, each made unique) in one
namespace, then times `find` on prompts of about 1k, 8k and 32k tokens (tokens counted with the default
model's tokenizer) made of registered documents, unregistered text and a question. Prints the median
and the range of `--repeat` lookups per prompt size, and the load average before and after: run it alone.
"""

import argparse
import os
import random
import statistics
import time

from sglang_mepic.frontend.known_texts import KnownTexts, text_bytes


def paragraphs() -> list[str]:
    """Every paragraph of the bundled SQuAD set."""
    from eval.lib.workloads import load_json
    return [p["context"] for article in load_json("squad.json")["data"] for p in article["paragraphs"]]


def token_counter():
    path = os.path.join("models", "smollm2-135m")
    try:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(path)
        return lambda text: len(tok.encode(text, add_special_tokens=False)), "SmolLM2-135M tokenizer"
    except Exception:
        return lambda text: len(text) // 4, "4 characters a token (no tokenizer at models/smollm2-135m)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--sizes", default="1000,8000,32000", help="prompt sizes in tokens")
    args = parser.parse_args()
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    base = paragraphs()
    docs = [f"[doc {i}] " + base[i % len(base)] for i in range(args.docs)]
    known = KnownTexts(sum(map(text_bytes, docs)) + (1 << 20))
    start = time.perf_counter()
    for d in docs:
        known.add("ns", d)
    register_s = time.perf_counter() - start
    count, how = token_counter()
    rng = random.Random(1)
    print(f"[known_lookup] {args.docs} documents registered in {register_s:.2f} s "
          f"({sum(map(len, docs)) / 1e6:.1f} M characters); tokens by {how}; load {load_before}")
    print("| prompt tokens | characters | documents found | lookup ms, median (min-max) |")
    print("|---|---|---|---|")
    for target in (int(s) for s in args.sizes.split(",")):
        parts = ["Answer the question from the documents below.\n\n"]
        while count("".join(parts)) < target:
            parts.append(rng.choice(docs) if rng.random() < 0.8 else rng.choice(base)[::-1])
            parts.append("\n\n")
        prompt = "".join(parts) + "Question: which document names the harbor?"
        found = known.find("ns", prompt)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            known.find("ns", prompt)
            times.append((time.perf_counter() - t) * 1e3)
        print(f"| {count(prompt):,} | {len(prompt):,} | {len(found)} | "
              f"{statistics.median(times):.2f} ({min(times):.2f}-{max(times):.2f}) |")
    print(f"[known_lookup] load before {load_before}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
