"""Answer quality (SQuAD's F1 and exact match) and fidelity of one run against another."""

import collections
import re
import string

# Agreement of one run with another lives in the package: the accuracy gate (check_model) uses it too.
from sglang_mepic.gate.agreement import prefix_agreement, top1_agreement  # noqa: F401


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


def contains(prediction: str, golds) -> float:
    """Whether a gold answer appears in the prediction (normalised): a verbose answer that holds
    it scores 1 here where exact match gives 0 and F1 little."""
    p = " " + " ".join(normalize(prediction)) + " "
    return float(any(normalize(g) and " " + " ".join(normalize(g)) + " " in p for g in golds))
