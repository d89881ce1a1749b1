"""How closely one run's next-token predictions follow a reference run's.

Shared by the accuracy gate (check_model) and the evaluation (eval/lib/scoring.py).
"""

import math
from typing import Mapping, Sequence

# A probability the reference gives a bucket but the compared run gives (numerically) none:
# the KL term would be infinite, so the compared mass is floored here instead.
MASS_FLOOR = 1e-12


def prefix_agreement(out: list[int], ref: list[int], n: int) -> float:
    """Share of the reference's first n tokens (fewer if it stopped earlier) matched before the first difference."""
    k = 0
    while k < min(len(out), len(ref), n) and out[k] == ref[k]:
        k += 1
    return k / max(1, min(n, len(ref)))


def top1_agreement(out: list[int], ref: list[int]) -> float:
    return float(out[:1] == ref[:1])


def lumped_kl(reference_top: Mapping[int, float], compared: Mapping[int, float]) -> float:
    """KL(reference || compared) over the reference's top-k tokens plus one bucket for the rest.

    `reference_top` maps the reference's top-k token ids to their log-probabilities;
    `compared` maps (at least) the same ids to the compared run's log-probabilities.
    Both masses of every bucket are known exactly (the rest is 1 minus the listed mass),
    so this is the exact KL of the two distributions coarsened to those k + 1 buckets,
    and a lower bound of the full-vocabulary KL (coarsening never raises a divergence).
    """
    kl, p_listed, q_listed = 0.0, 0.0, 0.0
    for token, logp in reference_top.items():
        p, logq = math.exp(logp), compared[token]
        q = math.exp(logq)
        p_listed, q_listed = p_listed + p, q_listed + q
        if p > 0:
            kl += p * (logp - max(logq, math.log(MASS_FLOOR)))
    p_rest, q_rest = max(0.0, 1.0 - p_listed), max(MASS_FLOOR, 1.0 - q_listed)
    if p_rest > 0:
        kl += p_rest * (math.log(p_rest) - math.log(q_rest))
    return max(0.0, kl)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")
