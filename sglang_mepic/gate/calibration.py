"""The accuracy gate's calibration set: SQuAD questions over paragraphs marked as chunks.

The set ships as package data (`data/calibration.json`, built by
`python -m eval.reports.build_calibration`): each question comes with paragraphs of its
article, the one holding the answer among its neighbours, in a seeded shuffled
order, so paragraphs recur across questions at other positions, as retrieved
documents do. A prompt is rendered as the evaluation renders it (`eval.lib.workloads.render`):
the model's chat template where it has one, else plain text ending in "Answer:".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_mepic.frontend.markup import CHUNK_BEGIN_ID, CHUNK_END_ID, tokenize_text
from sglang_mepic.lang import chunk
from sglang_mepic.wire.layout import Kind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DATA = Path(__file__).with_name("data") / "calibration.json"


@dataclass(frozen=True)
class Prompt:
    marked: tuple[int, ...]  # input ids, each chunk between the -100 / -101 markers
    plain: tuple[int, ...]   # the same ids without markers: what `full` computes


@lru_cache(maxsize=None)
def load() -> dict:
    return json.loads(DATA.read_text())


def size() -> int:
    return len(load()["questions"])


def render(tokenizer: PreTrainedTokenizerBase, question: dict) -> str:
    data = load()
    docs = "".join(chunk(f"Document: {data['paragraphs'][i]}\n\n") for i in question["chunks"])
    user = f"{data['instruction']}\n\n{docs}Question: {question['question']}"
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return user + "\nAnswer:"


def prompts(tokenizer: PreTrainedTokenizerBase, n: int) -> list[Prompt]:
    """The first n questions as input ids, tokenized as the server tokenizes marked-up text
    (each piece on its own), so the marked and plain forms hold the same real tokens."""
    out = []
    for question in load()["questions"][:n]:
        pieces = tokenize_text(render(tokenizer, question),
                               lambda s, special: tokenizer.encode(s, add_special_tokens=special))
        marked: list[int] = []
        for piece in pieces:
            marked += [CHUNK_BEGIN_ID, *piece.tokens, CHUNK_END_ID] if piece.kind is Kind.CHUNK else piece.tokens
        out.append(Prompt(tuple(marked), tuple(t for p in pieces for t in p.tokens)))
    return out
