"""Reuse from unmarked prompts: the SQuAD paper workload sent plain, under `--mepic-auto-chunk known`.

    .venv/bin/python -m eval.experiments.known_reuse                       # tiny-4l, 100 requests, 7 chunks, reuse 0.85
    .venv/bin/python -m eval.experiments.known_reuse --requests 300 --seeds 0,1,2 --out eval/results/known  # committed

A RAG pipeline registers its documents at indexing time and pastes the retrieved ones into one plain
prompt (`Document: <text>` blocks, as common RAG templates join them). The same requests are sent
twice to one server, each time on a flushed cache, one at a time:
- **marked**: each document wrapped in `<|chunk|>` markup (the layout the client would have to write);
- **unmarked**: no markup; the workload's distinct documents are registered first with
  `POST /mepic/chunks` and `"warm": false` (so the first use computes them, as in the marked run).
Per form: the prompt tokens reused (the responses' `cached_tokens`), the chunks laid out, and the
greedy output tokens; printed: the reused-token ratio unmarked / marked (target >= 0.9) and how many
outputs are identical. Load average before and after: run it alone. Writes results.json under --out (without it
the scratch folder eval/results/local/known, git-ignored; the committed run: `--out eval/results/known`).
"""

import argparse
import json
import os
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import requests
from tqdm import tqdm

from eval.lib import provenance, served
from eval.lib.outputs import out_dir
from eval.lib.workloads import INSTRUCTION, with_reuse
from sglang_mepic.lang import chunk

ROOT = Path(__file__).resolve().parents[2]


def prompt(request, marked: bool) -> str:
    docs = "".join(f"Document: {chunk(d) if marked else d}\n\n" for d in request.docs)
    return f"{INSTRUCTION}\n\n{docs}Question: {request.question}\nAnswer:"


def send_all(server, texts, max_new: int, label: str) -> list[dict]:
    assert requests.post(server.url + "/flush_cache", timeout=120).status_code == 200
    out = []
    for text in tqdm(texts, desc=label, unit="req"):
        r = requests.post(server.url + "/generate", timeout=300, json={
            "text": text, "sampling_params": {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}})
        r.raise_for_status()
        body = r.json()
        meta = body["meta_info"]
        out.append({"ids": body["output_ids"], "cached": meta["cached_tokens"], "prompt": meta["prompt_tokens"],
                    "chunks": len(meta["mepic_chunks"])})
    return out


def run_seed(server, seed: int, args) -> dict:
    workload = with_reuse("squad", args.requests, args.chunks, args.reuse, seed)
    marked = send_all(server, [prompt(r, True) for r in workload], args.max_new_tokens, f"seed {seed} marked")
    docs = list(dict.fromkeys(d for r in workload for d in r.docs))
    for i in range(0, len(docs), 256):
        r = requests.post(server.url + "/mepic/chunks", timeout=300, json={"texts": docs[i:i + 256], "warm": False})
        r.raise_for_status()
    unmarked = send_all(server, [prompt(r, False) for r in workload], args.max_new_tokens, f"seed {seed} unmarked")
    reused = [sum(x["cached"] for x in form) for form in (marked, unmarked)]
    return {"seed": seed, "requests": len(workload), "documents": len(docs),
            "reused_tokens_marked": reused[0], "reused_tokens_unmarked": reused[1],
            "ratio": reused[1] / reused[0] if reused[0] else None,
            "prompt_tokens": sum(x["prompt"] for x in marked),
            "chunks_marked": sum(x["chunks"] for x in marked), "chunks_unmarked": sum(x["chunks"] for x in unmarked),
            "identical_outputs": sum(a["ids"] == b["ids"] for a, b in zip(marked, unmarked))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(ROOT / "models" / "tiny-4l"))
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--chunks", type=int, default=7)
    parser.add_argument("--reuse", type=float, default=0.85)
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--out", default=None, help="default: the scratch folder eval/results/local/known (git-ignored)")
    served.add_url(parser)
    args = parser.parse_args()
    args.out = out_dir(args.out, "known")
    if not args.url and not Path(args.model, "config.json").exists():
        raise SystemExit(f"no model at {args.model}: build it with python -m sglang_mepic.models tiny-4l")
    load_before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    started = time.time()
    with served.server(args.url, args.model, "--dtype", "float32", "--mepic-auto-chunk", "known") as server:
        rows = [run_seed(server, int(s), args) for s in args.seeds.split(",")]
    load_after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n[known_reuse] SQuAD, {args.chunks} chunks, reuse {args.reuse}, {args.requests} requests a seed; "
          f"load before {load_before}, after {load_after}; {time.time() - started:.0f} s")
    print("| seed | documents | reused tokens, marked | unmarked | unmarked / marked | chunks marked / unmarked | "
          "identical outputs |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['documents']} | {r['reused_tokens_marked']:,} | {r['reused_tokens_unmarked']:,} | "
              f"{r['ratio']:.3f} | {r['chunks_marked']} / {r['chunks_unmarked']} | "
              f"{r['identical_outputs']} of {r['requests']} |")
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    if ratios:
        print(f"median unmarked / marked: {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f});"
              f" target >= 0.9")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result = {"command": provenance.command("eval.experiments.known_reuse", sys.argv[1:]),
              "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "load_before": load_before, "load_after": load_after, "wall_s": round(time.time() - started, 1),
              "rows": rows}
    Path(args.out, "results.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
