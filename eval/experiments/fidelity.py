"""Fidelity of chunk reuse: SmolLM2-135M-Instruct on SQuAD, every mode against `full`.

    .venv/bin/python -m eval.experiments.fidelity [--questions 48] [--chunks 4] [--new-tokens 16]
                                      [--modes full,naive,epic-16,mepic,mepic:leading]
                                      [--prompt chat|raw] [--json results.json]

Each prompt asks one SQuAD question over `--chunks` paragraphs of its article:
the one holding the answer and others from the same article, in a seeded
shuffled order, so paragraphs recur across prompts at different positions.
Each chunk is marked up (`<|chunk|>...<|/chunk|>`) inside the user message of
the model's chat template (`--prompt raw`: plain text ending in "Answer:",
as a `/generate` user would send it). One server per mode (float32, greedy), 4 requests in
flight. Options follow a mode after colons: `leading` / `trailing` (pad placement),
`sink` / `nosink` (compile after the model's BOS or alone), `blocks=N` (recomputed
blocks), e.g. `mepic:leading:sink`.

Figures per mode, against `full` (no reuse):
- top-1: the first generated token equals full's;
- prefix: tokens of full's first `--new-tokens` matched before the first difference, over that
  (over full's length when it stopped earlier);
- EOS first: the share of outputs whose first token is the end of text (an empty answer);
- F1, EM: SQuAD token F1 and exact match of the answer against the gold answers (max over them);
- gold contained: a gold answer appears in the output (a verbose answer that holds it);
- recomputed: mean tokens computed per request in context (meta_info), and the
  server's peak KV pages in use.
"""

import argparse
import json
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests
from tqdm import tqdm

from eval.lib import served
from eval.lib.scoring import contains, exact_match, f1, prefix_agreement
from eval.lib.workloads import Request, load_json, render
from sglang_mepic.launch import models

def load_prompts(n: int, chunks: int, seed: int = 0) -> list[Request]:
    """One question per prompt over its article's paragraphs: the gold one and its neighbours
    as distractors (so paragraphs recur across questions), in a seeded shuffled order."""
    data = load_json("squad.json")["data"]
    rng = random.Random(seed)
    pool = []
    for article in data:
        paragraphs = [p["context"] for p in article["paragraphs"]]
        if len(paragraphs) < chunks:
            continue
        for i, p in enumerate(article["paragraphs"]):
            for qa in p["qas"]:
                if not qa.get("is_impossible") and qa["answers"]:
                    pool.append((paragraphs, i, qa))
    rng.shuffle(pool)
    prompts = []
    for paragraphs, i, qa in pool[:n]:
        others = sorted((j for j in range(len(paragraphs)) if j != i), key=lambda j: abs(j - i))
        picked = [i] + others[:chunks - 1]
        rng.shuffle(picked)
        prompts.append(Request(tuple(paragraphs[j] for j in picked), qa["question"],
                               tuple(sorted({a["text"] for a in qa["answers"]}))))
    return prompts


OPTIONS = {"leading": ["--mepic-placement", "leading"], "trailing": ["--mepic-placement", "trailing"],
           "sink": ["--mepic-compile-sink", "bos"], "nosink": ["--mepic-compile-sink", "none"]}


def server_args(mode: str) -> list[str]:
    """`mepic:leading:sink:blocks=2` -> launcher flags."""
    name, *options = mode.split(":")
    args = ["--dtype", "float32", "--mepic-mode", name]
    for opt in options:
        if opt.startswith("blocks="):
            args += ["--mepic-recompute-blocks", opt.split("=", 1)[1]]
        elif opt in OPTIONS:
            args += OPTIONS[opt]
        else:
            sys.exit(f"unknown mode option {opt!r} in {mode!r}: use {', '.join(OPTIONS)} or blocks=N")
    return args


def run_mode(model: str, mode: str, texts: list[str], new_tokens: int, in_flight: int,
             url: str | None = None) -> tuple[list[dict], dict]:
    args = server_args(mode)
    with served.server(url, model, *args, startup_timeout=600) as server:
        def generate(text):
            r = requests.post(server.url + "/generate", timeout=600, json={
                "text": text, "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}})
            r.raise_for_status()
            return r.json()

        with ThreadPoolExecutor(in_flight) as pool:
            outs = list(tqdm(pool.map(generate, texts), total=len(texts), desc=mode, unit="prompt", leave=False))
        info = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0].get("mepic", {})
    return outs, info


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=48)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--modes", default="full,naive,epic-16,mepic,mepic:leading")
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--prompt", choices=("chat", "raw"), default="chat",
                    help="chat template (default) or raw text ending in 'Answer:'")
    ap.add_argument("--json", type=Path, default=None, help="also write per-mode figures here")
    served.add_url(ap)
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer

    model = args.model or str(models.build(models.DEFAULT_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = load_prompts(args.questions, args.chunks)
    texts = [render(tokenizer, p, chat=args.prompt == "chat") for p in prompts]
    modes = args.modes.split(",")
    if modes[0] != "full":
        modes = ["full"] + [m for m in modes if m != "full"]
    print(f"{len(prompts)} SQuAD questions x {args.chunks} chunks, {args.prompt} prompts, {args.new_tokens} new tokens, "
          "greedy, float32" + (f"; every mode on the server at {args.url} (--url)" if args.url else ""))

    results, reference = {}, None
    for mode in modes:
        t0 = time.time()
        outs, info = run_mode(model, mode, texts, args.new_tokens, args.in_flight, args.url)
        ids = [o["output_ids"] for o in outs]
        if reference is None:
            reference = ids
        n = len(ids)
        results[mode] = {
            "top1": sum(a[:1] == b[:1] for a, b in zip(ids, reference)) / n,
            "prefix": sum(prefix_agreement(a, b, args.new_tokens) for a, b in zip(ids, reference)) / n,
            "eos_first": sum(not o["output_ids"] or o["output_ids"][0] == tokenizer.eos_token_id for o in outs) / n,
            "f1": sum(f1(o["text"], p.answers) for o, p in zip(outs, prompts)) / n,
            "em": sum(exact_match(o["text"], p.answers) for o, p in zip(outs, prompts)) / n,
            "contains": sum(contains(o["text"], p.answers) for o, p in zip(outs, prompts)) / n,
            "recomputed": sum(o["meta_info"].get("mepic_recomputed_tokens",
                                                 o["meta_info"]["prompt_tokens"] - o["meta_info"]["cached_tokens"])
                              for o in outs) / n,
            "prompt_tokens": sum(o["meta_info"]["prompt_tokens"] for o in outs) / n,
            "peak_pages": info.get("kv_pages_in_use_peak"),
            "seconds": round(time.time() - t0, 1),
        }
        r = results[mode]
        print(f"  {mode:<16} top-1 {r['top1']:.3f}  prefix {r['prefix']:.3f}  EOS first {r['eos_first']:.3f}  "
              f"F1 {r['f1']:.3f}  EM {r['em']:.3f}  contained {r['contains']:.3f}  "
              f"recomputed {r['recomputed']:.0f}/{r['prompt_tokens']:.0f} tokens  ({r['seconds']} s)", flush=True)

    print(f"\n| mode | top-1 agreement | prefix agreement ({args.new_tokens}) | EOS first | F1 | EM | gold contained "
          "| tokens recomputed / prompt | peak KV pages |")
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['top1']:.3f} | {r['prefix']:.3f} | {r['eos_first']:.3f} | {r['f1']:.3f} | "
              f"{r['em']:.3f} | {r['contains']:.3f} | {r['recomputed']:.0f} / {r['prompt_tokens']:.0f} | {r['peak_pages']} |")
    if args.json:
        args.json.write_text(json.dumps({"questions": len(prompts), "chunks": args.chunks,
                                         "new_tokens": args.new_tokens, "prompt": args.prompt, "results": results}, indent=2))


if __name__ == "__main__":
    main()
