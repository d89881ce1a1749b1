"""The accuracy gate's figures, thresholds and verdict.

The figures compare a reuse mode with full recompute on the calibration set
(check_model measures them):
- top-1: share of questions whose first generated token equals full's;
- KL: mean KL(full || mode) of the next-token distribution, over every question's
  first generated positions (up to 16), both runs teacher-forced on full's greedy
  tokens, so both distributions at a position follow the same prefix; each
  distribution is full's top-k tokens plus one bucket for the rest
  (`agreement.lumped_kl`), in nats;
- prefix: mean share of full's first tokens (up to 16) that the mode's own greedy
  output matches before the first difference.

Why the defaults are what they are (figures measured 2026-11-24, 64 questions;
README "Is my model a good fit?"):
- Greedy text is a poor pass/fail signal on its own: a token's argmax flips
  where two candidates are close, after which the texts part for good.
  SmolLM2-135M-Instruct, a real model, keeps only a minority of its first 16
  tokens under reuse (the evaluation's 200 questions: prefix 0.39, with EPIC's
  recompute the same). So the prefix threshold only catches outputs that part
  at once, and the verdict rests on top-1 and KL.
- MIN_TOP1: the first token is where reuse matters most (it is conditioned on
  the reused chunks and nothing generated yet); a model that keeps it in 9 of
  10 questions or more is close to full recompute where it counts.
- MAX_KL: the per-position distributions must stay close on average; the bound
  lies between SmolLM2's measured KL and the tiny random model's.
"""

from dataclasses import dataclass, field

POSITIONS = 16  # generated positions compared per question
TOP_K = 20      # full's tokens listed per position for the KL (the rest is one bucket)
MIN_TOP1 = 0.9
MAX_KL = 0.5
MIN_PREFIX = 0.2


@dataclass(frozen=True)
class Thresholds:
    min_top1: float = MIN_TOP1
    max_kl: float = MAX_KL
    min_prefix: float = MIN_PREFIX


@dataclass(frozen=True)
class Figures:
    questions: int
    top1: float       # share of first tokens equal to full's
    kl: float         # mean KL(full || mode) per compared position, nats
    prefix: float     # mean greedy prefix agreement with full
    positions: int    # positions the KL is averaged over


@dataclass(frozen=True)
class Verdict:
    mode: str
    figures: Figures
    thresholds: Thresholds
    failures: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        f, t = self.figures, self.thresholds
        word = "PASS" if self.passed else "FAIL"
        return [f"mode {self.mode} against full, {f.questions} questions:",
                f"  top-1 agreement (first token)   {f.top1:.3f}   (pass: >= {t.min_top1:g})",
                f"  mean KL, first {POSITIONS} positions    {f.kl:<7.4g} (pass: <= {t.max_kl:g} nats; "
                f"{f.positions} positions)",
                f"  greedy prefix agreement ({POSITIONS})   {f.prefix:.3f}   (pass: >= {t.min_prefix:g})",
                f"verdict: {word}" + (f" ({'; '.join(self.failures)})" if self.failures else "")]


def judge(mode: str, figures: Figures, thresholds: Thresholds) -> Verdict:
    failures = []
    if not figures.top1 >= thresholds.min_top1:
        failures.append(f"top-1 {figures.top1:.3f} < {thresholds.min_top1:g}")
    if not figures.kl <= thresholds.max_kl:  # a NaN fails too
        failures.append(f"KL {figures.kl:.4g} > {thresholds.max_kl:g}")
    if not figures.prefix >= thresholds.min_prefix:
        failures.append(f"prefix {figures.prefix:.3f} < {thresholds.min_prefix:g}")
    return Verdict(mode, figures, thresholds, tuple(failures))
