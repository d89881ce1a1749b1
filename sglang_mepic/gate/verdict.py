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

Why the defaults are what they are (docs/answers.md, "Is my model a good fit?", has the
measured figures):
- MIN_TOP1: the first token is where reuse matters most (it is conditioned on the
  reused chunks and nothing generated yet). This project's fidelity target for
  mepic is a top-1 agreement of 0.9, which SmolLM2-135M-Instruct met on the
  evaluation's 200 questions (0.945). On the gate's 64 questions a share near 0.9
  has a standard error of sqrt(0.9 * 0.1 / 64) = 0.04, so a bound at the target
  would fail a model that meets it about one run in two; the default is the
  target less about three standard errors. A random model (the tiny test model)
  is at chance, 0.5: its nearly flat distributions break near-ties arbitrarily.
- MAX_KL: about twice SmolLM2's mean KL under mepic, so a model as good as
  SmolLM2 passes through sampling noise, while reuse that distorts the
  distributions as much as reusing chunks with nothing recomputed (`naive`, the
  error the recomputed first block exists to repair) does on SmolLM2 sits at
  the bound or above. KL alone cannot catch a random model: its distributions
  are nearly uniform whatever the context, so their KL is near 0.
- MIN_PREFIX: reported, not gated (0). One flipped near-tie ends the prefix for
  good: SmolLM2 keeps 39% of full's first 16 tokens under mepic on the
  evaluation's 200 questions, the same as EPIC's recompute, so the figure says
  little about a model's fit on its own.
"""

from dataclasses import dataclass, field

POSITIONS = 16  # generated positions compared per question
TOP_K = 20      # full's tokens listed per position for the KL (the rest is one bucket)
MIN_TOP1 = 0.8
MAX_KL = 0.25
MIN_PREFIX = 0.0


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
                f"  greedy prefix agreement ({POSITIONS})   {f.prefix:.3f}   "
                + (f"(pass: >= {t.min_prefix:g})" if t.min_prefix > 0 else "(reported, not gated: --min-prefix)"),
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
