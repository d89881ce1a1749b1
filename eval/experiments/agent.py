"""Agent-shaped workload: conversations that re-read the same files and tool outputs at shifting positions.

    .venv/bin/python -m eval.experiments.agent                                  # SmolLM2, 2 conversations x 6 turns
    .venv/bin/python -m eval.experiments.agent --model models/tiny --conversations 4 --turns 10
    .venv/bin/python -m eval.experiments.agent --conversations 4 --turns 8 --repeats 3   # 3 seeds: medians and ranges
    .venv/bin/python -m eval.experiments.agent --conversations 4 --turns 8 --repeats 3 --out eval/results/agent  # committed

Nobody marks a chunk: the MEPIC server runs with `--mepic-auto-chunk messages`
and plain OpenAI chat requests, so every long message but the last user turn is
a chunk. Against it: SGLang's own prefix cache (`vanilla`) and `full` (MEPIC's
engine, chunks computed in context), the reference for agreement.

A conversation is an agent at work on one task (a SQuAD question). Each turn it
reads one more thing, a file (a paragraph of the task's SQuAD article) or a tool
output (a HotpotQA paragraph, as a search result), drawn with Zipf popularity
from pools every conversation shares, so the same contents come back. The
context keeps the last `--window` reads (an agent trimming its context), so a
read shifts to an earlier position each turn and then drops out, and the other
conversations read the same contents in other orders: the prefix cache loses
everything after the first message that changed, position-independent reuse
keeps each read. The assistant's turns are fixed tool calls (`read_file(...)`,
`search(...)`), so every system is sent the very same prompts.

Turns of a conversation are sequential; conversations run at once. Per system:
prompt tokens computed per turn (not served from the cache: `prompt_tokens -
cached_tokens` of the OpenAI usage; for MEPIC that counts its own chunk
compiles too), peak KV pages in use (the `/metrics` gauge, and MEPIC's exact
peak from `/server_info`), TTFT p50/p99 (streamed), and agreement with `full`
over the greedy output tokens (prefix agreement, top-1). With `--repeats N` the
workload is drawn and run with N seeds, every system once per seed (servers
restarted per seed, systems interleaved), and the table gives each figure's
median and range. Writes table.md and results.json under --out (without it the scratch folder
eval/results/local/agent, git-ignored; the committed run: `--out eval/results/agent`).
"""

import argparse
import json
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import requests
from tqdm import tqdm

from eval.experiments.run import Sampler, pct
from eval.lib import provenance, served
from eval.lib.outputs import out_dir
from eval.lib.scoring import prefix_agreement, top1_agreement
from eval.lib.workloads import load_json, zipf_weights
from sglang_mepic.launch.sglang_flags import MEPIC_PAGE_SIZE

ROOT = Path(__file__).resolve().parents[2]
SYSTEMS = {
    "vanilla": ["--attention-backend", "torch_native", "--radix-cache-backend", "sglang"],
    "full": ["--mepic-mode", "full"],
    "mepic": ["--mepic-mode", "mepic", "--mepic-auto-chunk", "messages"],
}
REFERENCE = "full"
SYSTEM_PROMPT = "You are a research agent. You read files and search results, then answer the task in a few words."


def pools(files: int, results: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """(files, tool outputs, tasks): paragraphs of one SQuAD article with its questions, and HotpotQA paragraphs."""
    article = next(a for a in load_json("squad.json")["data"] if len(a["paragraphs"]) >= files)
    paragraphs = article["paragraphs"][:files]
    tasks = [qa["question"] for p in paragraphs for qa in p["qas"] if not qa.get("is_impossible") and qa["answers"]]
    found = [f"{title}: {''.join(sentences)}" for q in load_json("hotpotqa.json") for title, sentences in q["context"]]
    rng = random.Random(seed)
    rng.shuffle(tasks)
    return [p["context"] for p in paragraphs], list(dict.fromkeys(found))[:results], tasks


def conversations(n: int, turns: int, window: int, files: int, results: int, seed: int) -> list[list[list[dict]]]:
    """n conversations, each a list of `turns` requests (message lists)."""
    file_pool, result_pool, tasks = pools(files, results, seed)
    rng = random.Random(seed)
    out = []
    for c in range(n):
        task = tasks[c % len(tasks)]
        reads: list[tuple[str, str]] = []  # (the assistant's call, the tool's answer)
        requests_ = []
        for t in range(turns):
            if rng.random() < 0.5:
                i = rng.choices(range(len(file_pool)), zipf_weights(len(file_pool)))[0]
                reads.append((f"read_file(\"notes/{i}.txt\")", file_pool[i]))
            else:
                i = rng.choices(range(len(result_pool)), zipf_weights(len(result_pool)))[0]
                reads.append((f"search(\"result {i}\")", result_pool[i]))
            messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"Task: {task}"}]
            for call, answer in reads[-window:]:
                messages += [{"role": "assistant", "content": call}, {"role": "tool", "content": answer}]
            messages.append({"role": "user", "content": f"Turn {t + 1}: answer the task if you can, in a few words."})
            requests_.append(messages)
        out.append(requests_)
    return out


def chat(url: str, messages: list[dict], new_tokens: int) -> dict:
    """One streamed greedy chat request: its output tokens, TTFT and usage."""
    t0 = time.perf_counter()
    ttft, tokens, usage = None, [], None
    with requests.post(url + "/v1/chat/completions", stream=True, timeout=900, json={
            "model": "default", "messages": messages, "max_tokens": new_tokens, "temperature": 0,
            "logprobs": True, "stream": True, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                continue
            data = json.loads(line[5:])
            usage = data.get("usage") or usage
            for choice in data.get("choices") or []:
                content = (choice.get("logprobs") or {}).get("content") or []
                if content and ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += [c["token"] for c in content]
    details = usage.get("prompt_tokens_details") or {}
    return {"tokens": tokens, "ttft": ttft, "e2e": time.perf_counter() - t0,
            "prompt_tokens": usage["prompt_tokens"], "cached_tokens": details.get("cached_tokens") or 0}


def run_system(name: str, model: str, convs, new_tokens: int, bar, url: str | None = None) -> dict:
    with served.server(url, model, "--dtype", "float32", *SYSTEMS[name]) as server:
        sampler = Sampler(server.url, MEPIC_PAGE_SIZE)
        sampler.start()
        start = time.perf_counter()

        def converse(turns):
            out = []
            for messages in turns:
                out.append(chat(server.url, messages, new_tokens))
                bar.update()
            return out

        with ThreadPoolExecutor(len(convs)) as pool:
            outputs = list(pool.map(converse, convs))
        seconds = time.perf_counter() - start
        time.sleep(2 * sampler.period)
        sampler.stop.set()
        sampler.join()
        info = requests.get(server.url + "/server_info", timeout=60).json()["internal_states"][0]
    exact = info.get("mepic", {}).get("kv_pages_in_use_peak")
    return {"outputs": outputs, "peak_pages": max([*sampler.pages, exact or 0], default=0), "seconds": seconds}


def summarize(runs: dict, turns: int, new_tokens: int) -> list[dict]:
    ref = [o for conv in runs[REFERENCE]["outputs"] for o in conv]
    rows = []
    for name, run in runs.items():
        flat = [o for conv in run["outputs"] for o in conv]
        computed = [o["prompt_tokens"] - o["cached_tokens"] for o in flat]
        per_turn = [statistics.fmean(conv[t]["prompt_tokens"] - conv[t]["cached_tokens"] for conv in run["outputs"])
                    for t in range(turns)]
        rows.append({
            "system": name, "requests": len(flat),
            "prompt_tokens": statistics.fmean(o["prompt_tokens"] for o in flat),
            "computed_tokens": statistics.fmean(computed), "computed_per_turn": per_turn,
            "peak_kv_pages": run["peak_pages"],
            "ttft_p50": pct([o["ttft"] for o in flat], 0.5), "ttft_p99": pct([o["ttft"] for o in flat], 0.99),
            "agreement": statistics.fmean(prefix_agreement(o["tokens"], r["tokens"], new_tokens)
                                          for o, r in zip(flat, ref)),
            "top1": statistics.fmean(top1_agreement(o["tokens"], r["tokens"]) for o, r in zip(flat, ref)),
            "seconds": run["seconds"],
        })
    return rows


FIGURES = ("prompt_tokens", "computed_tokens", "peak_kv_pages", "ttft_p50", "ttft_p99", "agreement", "top1",
           "seconds")


def medians(per_seed: list[list[dict]]) -> list[dict]:
    """One row per system: the median of each figure over the seeds, its range (`<figure>_range`),
    and the per-turn medians."""
    rows = []
    for i, first in enumerate(per_seed[0]):
        runs = [rows_[i] for rows_ in per_seed]
        row = {"system": first["system"], "requests": sum(r["requests"] for r in runs), "seeds": len(runs)}
        for key in FIGURES:
            values = [r[key] for r in runs]
            row[key], row[key + "_range"] = statistics.median(values), (min(values), max(values))
        row["computed_per_turn"] = [statistics.median(v) for v in zip(*(r["computed_per_turn"] for r in runs))]
        rows.append(row)
    return rows


def _cell(row: dict, key: str, fmt: str) -> str:
    low, high = row.get(key + "_range", (row[key], row[key]))
    value = format(row[key], fmt)
    return value if low == high else f"{value} ({format(low, fmt)}-{format(high, fmt)})"


def table(rows: list[dict]) -> str:
    lines = ["| system | prompt tok/turn | computed tok/turn | peak KV pages | TTFT p50 s | TTFT p99 s | "
             "agreement vs full | top-1 vs full |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [_cell(r, k, f) for k, f in (("prompt_tokens", ".0f"), ("computed_tokens", ".0f"),
                                             ("peak_kv_pages", ".0f"), ("ttft_p50", ".2f"), ("ttft_p99", ".2f"),
                                             ("agreement", ".3f"), ("top1", ".3f"))]
        lines.append(f"| {r['system']} | " + " | ".join(cells) + " |")
    lines += ["", "Computed prompt tokens per turn (mean over conversations):", "",
              "| system | " + " | ".join(f"turn {t + 1}" for t in range(len(rows[0]["computed_per_turn"]))) + " |",
              "|---|" + "---|" * len(rows[0]["computed_per_turn"])]
    lines += [f"| {r['system']} | " + " | ".join(f"{v:.0f}" for v in r["computed_per_turn"]) + " |" for r in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models" / "smollm2-135m"))
    ap.add_argument("--conversations", type=int, default=2)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--window", type=int, default=3, help="reads the context keeps (the latest)")
    ap.add_argument("--files", type=int, default=6, help="SQuAD paragraphs in the shared file pool")
    ap.add_argument("--results", type=int, default=6, help="HotpotQA paragraphs in the shared tool-output pool")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0, help="the first seed (workload draw)")
    ap.add_argument("--repeats", type=int, default=1, help="seeds to run (from --seed): medians and ranges")
    ap.add_argument("--out", default=None, help="default: the scratch folder eval/results/local/agent (git-ignored)")
    served.add_url(ap)
    args = ap.parse_args(argv)
    args.out = str(out_dir(args.out, "agent"))

    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: at least 1")
    seeds = list(range(args.seed, args.seed + args.repeats))
    load_before = open("/proc/loadavg").read().split()[:3]
    started, t0 = datetime.now(timezone.utc), time.perf_counter()
    per_seed, outputs = [], {}
    with tqdm(total=len(seeds) * len(SYSTEMS) * args.conversations * args.turns, desc="agent turns") as bar:
        for seed in seeds:
            convs = conversations(args.conversations, args.turns, args.window, args.files, args.results, seed)
            runs = {}
            for name in SYSTEMS:
                bar.set_postfix_str(f"{name} seed {seed}")
                runs[name] = run_system(name, args.model, convs, args.new_tokens, bar, args.url)
            per_seed.append(summarize(runs, args.turns, args.new_tokens))
            outputs[seed] = {name: run["outputs"] for name, run in runs.items()}
    wall = time.perf_counter() - t0
    rows = medians(per_seed)
    load_after = open("/proc/loadavg").read().split()[:3]
    command = provenance.command("eval.experiments.agent", argv if argv is not None else os.sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scale = (f"{args.conversations} conversations x {args.turns} turns, window {args.window} reads, pools of "
             f"{args.files} files + {args.results} tool outputs, {args.new_tokens} new tokens, float32, greedy")
    header = [f"# Agent-shaped workload ({Path(args.model).name})", "",
              f"- command: `{command.strip()}`", f"- model: {provenance.portable(args.model)}", f"- scale: {scale}",
              f"- date: {started.isoformat(timespec='seconds')}",
              f"- wall time: {wall:.0f} s " + (f"(every system on the server at {args.url}, --url)" if args.url
                                              else f"({len(SYSTEMS) * len(seeds)} servers started)"),
              f"- seeds: {', '.join(map(str, seeds))}" + (": each figure is the median over them, its range in "
                                                         "parentheses" if len(seeds) > 1 else ""),
              f"- machine load (1/5/15 min) before: {' '.join(load_before)}, after: {' '.join(load_after)}",
              f"- systems: " + "; ".join(f"{k}: `{' '.join(v)}`" for k, v in SYSTEMS.items()), ""]
    (out / "table.md").write_text("\n".join(header) + table(rows) + "\n")
    (out / "results.json").write_text(json.dumps({
        "command": command.strip(), "model": provenance.portable(args.model), "scale": scale,
        "args": {k: provenance.portable(v) if k in ("model", "out") else v for k, v in vars(args).items()},
        "date": started.isoformat(), "wall_s": wall, "loadavg_before": load_before, "loadavg_after": load_after,
        "systems": SYSTEMS, "seeds": seeds, "rows": rows, "per_seed": dict(zip(seeds, per_seed)),
        "outputs": outputs}, indent=1))
    print("\n".join(header) + table(rows))


if __name__ == "__main__":
    main()
