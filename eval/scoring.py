"""Answer quality (SQuAD's F1 and exact match) and fidelity of one run against another."""

import collections
import re
import string


def normalize(s: str) -> list[str]:
    """SQuAD's official answer normalisation: lower case, no punctuation or articles."""
    s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
    return re.sub(r"\b(a|an|the)\b", " ", s).split()


def f1(prediction: str, golds) -> float:
    def one(gold):
        p, g = normalize(prediction), normalize(gold)
        if not p or not g:
            return float(p == g)
        common = sum((collections.Counter(p) & collections.Counter(g)).values())
        if common == 0:
            return 0.0
        precision, recall = common / len(p), common / len(g)
        return 2 * precision * recall / (precision + recall)
    return max(one(g) for g in golds)


def exact_match(prediction: str, golds) -> float:
    return float(any(normalize(prediction) == normalize(g) for g in golds))


def prefix_agreement(out: list[int], ref: list[int], n: int) -> float:
    """Share of the reference's first n tokens (fewer if it stopped earlier) matched before the first difference."""
    k = 0
    while k < min(len(out), len(ref), n) and out[k] == ref[k]:
        k += 1
    return k / max(1, min(n, len(ref)))


def top1_agreement(out: list[int], ref: list[int]) -> float:
    return float(out[:1] == ref[:1])
