"""What a prefill forward costs against the tokens it computes: its fixed part and its per-token part.

    .venv/bin/python -m eval.bench.forward_cost [--model models/smollm2-135m] [--systems vanilla,mepic]
                                          [--tokens 16,64,128,256,512,1024] [--repeats 5] [--poll-metrics]
    .venv/bin/python -m eval.bench.forward_cost --context 0,256,512,1024 [--question 64] [--head 16] [--poll-metrics] [...]

One server per system (eval.experiments.run's flags, float32). Requests go one at a time, so
each prefill is alone in its batch: prompts of random token ids (a fresh draw per
request, so no prefix is cached), one new token. The forward is SGLang's
`prefill_finished_time - forward_entry_time` (what eval.experiments.run reports as forward).
Prints its p50 per prompt length and the least-squares line forward = a + b * tokens:
`a` is the cost that does not shrink when reuse cuts the tokens computed, and
bounds what any reuse can do to a prefill's latency on this machine.

`--context 0,256,512,1024` measures instead what a reused context costs: each
prompt is stored chunks of about that many tokens (chunks of 128 random tokens)
and then a question of `--question` fresh random tokens. After the first such
request every system holds the chunks as the prompt's exact prefix (mepic's
tree keeps them in natural order too), so each forward computes the question
alone while its queries attend to the whole context: the cost that a request
whose chunks were all stored pays for keys it did not compute.
`--head N` puts N fresh random tokens before the chunks, as a RAG prompt's
varying instruction or chunk order does: the chunks are then no prefix, vanilla
computes them, and mepic reuses them through its plan (pages reordered, each
chunk's first block recomputed, RoPE at mapped positions, an explicit mask).

`--poll-metrics` also polls `/metrics` ten times a second meanwhile, as eval.experiments.run's
KV sampler does during its points: on 2 cores what the server's HTTP process
spends on it is taken from the forward's threads.
"""

import argparse
import contextlib
import json
import random
import statistics
from pathlib import Path

import requests

from eval.experiments.run import SYSTEMS, Sampler, computed_tokens
from eval.lib import served
from sglang_mepic.lang import chunk
from sglang_mepic.launch import models

CHUNK_TOKENS = 128


def refused(r, what: str) -> None:
    """Stop with the server's reason (a prompt past the context length, say), not only its status."""
    if not r.ok:
        raise SystemExit(f"forward_cost: {what} refused: HTTP {r.status_code}: {r.text[:300]}")


def forward(server, ids: list[int]) -> float:
    """One request alone: its forward in seconds."""
    r = requests.post(server.url + "/generate", timeout=600, json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    refused(r, f"{len(ids)}-token prompt")
    meta = r.json()["meta_info"]
    return meta["prefill_finished_time"] - meta["forward_entry_time"]


def text_forward(server, text: str) -> tuple[float, int, int]:
    """One text request alone: its forward in seconds, its prompt tokens, and the tokens it computed."""
    r = requests.post(server.url + "/generate", timeout=600, json={
        "text": text, "sampling_params": {"max_new_tokens": 1, "temperature": 0}})
    refused(r, f"{len(text)}-character prompt")
    meta = r.json()["meta_info"]
    return meta["prefill_finished_time"] - meta["forward_entry_time"], meta["prompt_tokens"], computed_tokens(meta)


@contextlib.contextmanager
def polled(server, poll: bool):
    """With `poll`, /metrics is polled at 10 Hz while the block runs, as eval.experiments.run's KV sampler does."""
    sampler = Sampler(server.url, page_size=1)
    if poll:
        sampler.start()
    try:
        yield
    finally:
        sampler.stop.set()


def context_cost(model: str, systems: list[str], contexts: list[int], question: int, head: int, repeats: int,
                 words, poll: bool, url: str | None = None) -> None:
    """Forward p50 against the stored context each prompt attends to (see the module's doc)."""
    print(f"model {Path(model).name}, float32, one request at a time, 1 new token, {repeats} per context; "
          + (f"{head} fresh head tokens, " if head else "")
          + f"stored chunks of {CHUNK_TOKENS} random tokens, then {question} fresh question tokens"
          + ("; /metrics polled at 10 Hz meanwhile" if poll else ""))
    print("| system | " + " | ".join(f"{c} ctx" for c in contexts)
          + " | computed tok/req | fixed a (s) | per context token b (ms) |")
    print("|---|" + "---|" * (len(contexts) + 3))
    # The same chunks for every system, drawn once per context length.
    docs = {c: "".join(chunk(words(CHUNK_TOKENS) + "\n") for _ in range(c // CHUNK_TOKENS)) for c in contexts}
    for system in systems:
        with served.server(url, model, "--dtype", "float32", *SYSTEMS[system], startup_timeout=600) as server:
            text_forward(server, words(question))  # warm-up
            xs, ys, cells, computed = [], [], [], []
            with polled(server, poll):
                for c in contexts:
                    draw = lambda: (words(head) if head else "") + docs[c] + words(question)  # noqa: E731
                    text_forward(server, draw())  # stores the chunks (compiles, or the prefix)
                    runs = [text_forward(server, draw()) for _ in range(repeats)]
                    xs += [prompt - done for _, prompt, done in runs]  # the tokens reused
                    ys += [f for f, _, _ in runs]
                    cells.append(f"{statistics.median(f for f, _, _ in runs):.3f}")
                    computed.append(f"{statistics.median(done for _, _, done in runs):.0f}")
            # With --head, vanilla reuses nothing: no line to fit.
            b, a = statistics.linear_regression(xs, ys) if len(set(xs)) > 1 else (None, None)
            fit = f"{a:.3f} | {b * 1e3:.3f}" if b is not None else "— | —"
            print(f"| {system} | " + " | ".join(cells) + f" | {' / '.join(computed)} | {fit} |", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF model folder (default: the embedded SmolLM2-135M-Instruct)")
    ap.add_argument("--systems", default="vanilla,mepic", help="comma-separated, from " + ", ".join(SYSTEMS))
    ap.add_argument("--tokens", default="16,64,128,256,512,1024", help="comma-separated prompt lengths")
    ap.add_argument("--repeats", type=int, default=5, help="requests per length (after one warm-up request)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--context", default=None,
                    help=f"comma-separated stored-context lengths in tokens (multiples of {CHUNK_TOKENS}): "
                         "measure the forward against the reused context instead of the tokens computed")
    ap.add_argument("--question", type=int, default=64, help="with --context: fresh tokens after the chunks")
    ap.add_argument("--head", type=int, default=0, help="with --context: fresh tokens before the chunks")
    ap.add_argument("--poll-metrics", action="store_true", help="poll /metrics at 10 Hz meanwhile, as eval.experiments.run does")
    served.add_url(ap)
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
    if args.context is not None:
        contexts = [int(c) for c in args.context.split(",")]
        if (len(set(contexts)) < 2 or any(c < 0 or c % CHUNK_TOKENS for c in contexts) or args.question < 1
                or args.head < 0):
            raise SystemExit(f"bad arguments: --context {args.context} (two lengths or more, each a multiple of "
                             f"{CHUNK_TOKENS}), --question {args.question} (at least 1), --head {args.head} (>= 0)")
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(model)

        def words(n: int) -> str:
            return tokenizer.decode([rng.randrange(low, high) for _ in range(n)])

        context_cost(model, systems, contexts, args.question, args.head, args.repeats, words, args.poll_metrics,
                     args.url)
        return
    print(f"model {Path(model).name}, float32, one request at a time, 1 new token, {args.repeats} per length"
          + (", /metrics polled at 10 Hz meanwhile" if args.poll_metrics else ""))
    print("| system | " + " | ".join(f"{n} tok" for n in lengths) + " | fixed a (s) | per token b (ms) |")
    print("|---|" + "---|" * (len(lengths) + 2))
    for system in systems:
        with served.server(args.url, model, "--dtype", "float32", *SYSTEMS[system], startup_timeout=600) as server:
            forward(server, [rng.randrange(low, high) for _ in range(lengths[0])])  # warm-up
            xs, ys, cells = [], [], []
            with polled(server, args.poll_metrics):
                for n in lengths:
                    times = [forward(server, [rng.randrange(low, high) for _ in range(n)])
                             for _ in range(args.repeats)]
                    xs += [n] * len(times)
                    ys += times
                    cells.append(f"{statistics.median(times):.3f}")
            b, a = statistics.linear_regression(xs, ys)
            print(f"| {system} | " + " | ".join(cells) + f" | {a:.3f} | {b * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
