"""Is reuse accurate enough on this model? The per-model accuracy gate.

    python -m sglang_mepic.check_model --model-path DIR [--mode mepic|epic-16|...] [--questions N]
                                       [--min-top1 X] [--max-kl X] [--min-prefix X] [-- SERVER FLAGS...]

Runs the calibration set that ships with the package (SQuAD questions over
paragraphs marked as chunks, in shuffled orders; calibration.py) on one server
in the chosen mode, and compares each answer with full recompute on the same
server: the same input ids without chunk markers, which is exactly what `full`
computes (markers removed, nothing reused; design.md "Modes"). Greedy, float32
on CPU unless the server flags say otherwise. Per question, three requests:

1. full's greedy answer (up to 16 tokens);
2. full teacher-forced on that answer (input logprobs): its top-20 next-token
   log-probabilities at each of those positions;
3. the mode teacher-forced on full's answer: its argmax at each position (for
   top-1 and greedy prefix agreement) and its log-probabilities of the tokens full
   listed there (`token_ids_logprob`, for the KL).

It prints top-1 agreement, mean KL over the first 16 positions and greedy
prefix agreement (verdict.py says how each is computed and why the thresholds are
what they are), then the verdict. Exit status: 0 when the model passes, 1 when
it does not, 2 for bad arguments. Flags after `--` go to the server
(`sglang_mepic.launch_server`), e.g. `-- --dtype bfloat16 --mepic-recompute-blocks 2`.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import requests

from sglang_mepic import config, env, modes
from sglang_mepic.gate import calibration
from sglang_mepic.gate import verdict as gate
from sglang_mepic.gate.agreement import lumped_kl, mean, prefix_agreement, top1_agreement

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

IN_FLIGHT = 4
REQUEST_TIMEOUT = 600


def _generate(url: str, ids: Sequence[int], new_tokens: int, **logprobs: Any) -> dict:
    r = requests.post(url + "/generate", timeout=REQUEST_TIMEOUT, json={
        "input_ids": list(ids), "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0}, **logprobs})
    r.raise_for_status()
    return r.json()


def _teacher_forced(url: str, ids: Sequence[int], prompt_len: int, answer: list[int], **asked: Any) -> dict:
    """Input logprobs over the answer appended to the prompt: per answer position, the entries
    of the distribution that predicts it, given the prompt and the answer before it. SGLang's
    first requested entry is None, so the request starts one token before the answer."""
    meta = _generate(url, [*ids, *answer], 1, return_logprob=True, logprob_start_len=prompt_len - 1,
                     **asked)["meta_info"]
    return {field: meta[field][1:1 + len(answer)] for field in ("input_top_logprobs", "input_token_ids_logprobs")
            if meta.get(field)}


def compare_one(url: str, prompt: calibration.Prompt) -> tuple[float, float, list[float]]:
    """(top-1, prefix agreement, KL per position) of one question.

    Full's greedy answer, then both forms teacher-forced on it. Where the mode's argmax
    equals full's token at every position before t, its own greedy answer would be full's
    up to t, so the leading run of equal argmaxes is its greedy prefix agreement, without
    decoding it."""
    full = _generate(url, prompt.plain, gate.POSITIONS)["output_ids"][:gate.POSITIONS]
    if not full:
        return 0.0, 0.0, []
    full_top = _teacher_forced(url, prompt.plain, len(prompt.plain), full,
                               top_logprobs_num=gate.TOP_K)["input_top_logprobs"]
    listed = sorted({entry[1] for position in full_top for entry in position})
    reuse = _teacher_forced(url, prompt.marked, len(prompt.plain), full, top_logprobs_num=1,
                            token_ids_logprob=listed)
    reuse_argmax = [position[0][1] for position in reuse["input_top_logprobs"]]
    kls = [lumped_kl({e[1]: e[0] for e in p}, {e[1]: e[0] for e in q})
           for p, q in zip(full_top, reuse["input_token_ids_logprobs"])]
    return top1_agreement(reuse_argmax, full), prefix_agreement(reuse_argmax, full, gate.POSITIONS), kls


def measure(url: str, tokenizer: PreTrainedTokenizerBase, questions: int, progress: bool = True) -> gate.Figures:
    """The gate's figures from a running server in the mode under test."""
    from tqdm import tqdm

    prompts = calibration.prompts(tokenizer, questions)
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        results = list(tqdm(pool.map(lambda p: compare_one(url, p), prompts), total=len(prompts),
                            desc="check_model", unit="question", disable=not progress, file=sys.stderr))
    kls = [kl for _, _, per_position in results for kl in per_position]
    return gate.Figures(questions=len(results), top1=mean([r[0] for r in results]), kl=mean(kls),
                        prefix=mean([r[1] for r in results]), positions=len(kls))


def run_gate(model_path: str, mode: modes.Mode, questions: int, thresholds: gate.Thresholds,
             server_args: list[str], env: dict[str, str] | None = None, progress: bool = True,
             log: Callable[[str], None] = print) -> gate.Verdict:
    """Start a server for the mode (on a free loopback port, always stopped), measure, judge."""
    from transformers import AutoTokenizer

    from sglang_mepic.process.server_process import ServerProcess

    model_path = str(Path(model_path).expanduser().resolve())  # the server runs in another directory
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    log(f"starting a {mode.name} server on {model_path} for the accuracy gate ({questions} questions)")
    with ServerProcess(model_path, *server_args, "--mepic-mode", mode.name, startup_timeout=900,
                       env=env) as server:
        figures = measure(server.url, tokenizer, questions, progress)
    return gate.judge(mode.name, figures, thresholds)


def _fraction(name: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 1:
            raise argparse.ArgumentTypeError(f"{name} {text!r}: give a number between 0 and 1")
        return value
    return parse


def _nats(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"--max-kl {text!r}: give a number of nats >= 0")
    return value


def _mode(text: str) -> modes.Mode:
    try:
        return modes.parse_mode(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--mepic-mode", "--mode")) from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_mepic.check_model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True, help="local HF model folder")
    ap.add_argument("--mode", type=_mode, default=env.Settings.from_env({}).mode, metavar="MODE",
                    help=f"the reuse mode to check: {modes.MODE_HELP}. Default: {config.MODE.default}.")
    ap.add_argument("--questions", type=int, default=calibration.size(), metavar="N",
                    help=f"calibration questions to run, 1-{calibration.size()}. Default: all {calibration.size()}.")
    ap.add_argument("--min-top1", type=_fraction("--min-top1"), default=gate.MIN_TOP1, metavar="X",
                    help=f"lowest top-1 agreement that passes. Default: {gate.MIN_TOP1:g}.")
    ap.add_argument("--max-kl", type=_nats, default=gate.MAX_KL, metavar="NATS",
                    help=f"highest mean KL that passes. Default: {gate.MAX_KL:g}.")
    ap.add_argument("--min-prefix", type=_fraction("--min-prefix"), default=gate.MIN_PREFIX, metavar="X",
                    help=f"lowest greedy prefix agreement that passes. Default: {gate.MIN_PREFIX:g}.")
    return ap


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Our flags, and the server's (after `--`)."""
    ours, server = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = parser()
    args = ap.parse_args(ours)
    if not 1 <= args.questions <= calibration.size():
        ap.error(f"--questions {args.questions}: give 1 to {calibration.size()} (the calibration set's size)")
    folder = Path(args.model_path).expanduser()
    if not (folder / "config.json").is_file():
        ap.error(f"--model-path {folder}: not a local HF model folder (no config.json)")
    for flag in ("--mepic-mode", "--model-path", "--model", "--port", "--host"):
        if any(a == flag or a.startswith(flag + "=") for a in server):
            ap.error(f"{flag} after `--`: the gate sets it itself")
    return args, server


def main(argv: list[str] | None = None) -> int:
    args, server_args = parse_args(sys.argv[1:] if argv is None else list(argv))
    if not args.mode.reuses:
        print(f"mode {args.mode.name} recomputes everything: nothing to check")
        return 0
    thresholds = gate.Thresholds(args.min_top1, args.max_kl, args.min_prefix)
    verdict = run_gate(args.model_path, args.mode, args.questions, thresholds, server_args)
    print("\n".join(verdict.lines()), flush=True)
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
