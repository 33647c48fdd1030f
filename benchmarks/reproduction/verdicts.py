"""Verdicts with a size: a paper's claim against our paired seeds, one rule for the report's
header and the code, with its error rate stated truly.

A statistical check of a claim yields a :class:`Finding`: the per-seed differences ``d``,
oriented so that the claim reads ``mean(d) > margin`` (``margin`` 0 for "exceeds", ``-tol``
for "within tol of"), with their mean, standard error and count. It carries up to three
one-sided paired t-tests (:func:`hypotheses`):

* **for**: H0 ``mean(d) <= margin`` (rejecting it shows the claimed direction);
* **against**: H0 ``mean(d) >= margin`` (rejecting it shows the other direction);
* **half**: H0 ``mean(d) >= E/2``, where the paper gives an effect E (in ``d``'s units; for a
  bytes saving, E/2 times the baseline's mean): rejecting it excludes an effect of half the
  paper's size.

Holm's step-down method at :data:`LEVEL` runs over every such hypothesis of a paper's
checks together (one family per paper, :func:`holm`), so the chance that any rejection about
a paper is false stays at 5 %. With at least ``min_seeds`` paired seeds the verdict is, in
this order (:func:`verdict`):

* **contradicted**: *against* rejected;
* **reproduced**: *for* rejected and our estimate at least E/2 (or the paper gives no E);
* **smaller effect**: *for* rejected, our estimate below E/2;
* **no effect**: *half* rejected (neither direction shown, but an effect of half the paper's
  size is excluded: a tight null);
* **leans against**: nothing rejected, the estimate on the wrong side of the margin;
* **underpowered**: nothing rejected; :func:`seeds_needed` says how many seeds would decide
  at the measured spread (or that no count would reproduce the claim: the estimate lies below
  the size it must reach).

The first four are *decided* (:data:`DECIDED`). A comparison whose per-seed differences are
all equal (zero spread: bit-identical sides where that difference is 0) is no test either,
whatever its sign: **not checkable in this setting** (the setting cannot move it; an
ablation whose switch changes nothing here, say), never decided.

A bytes claim is tested on the ratio: ``d`` is the per-seed log of the baseline's bytes over
ours (kind ``'ratio'``), and the paper's saving E (a share) is the log ratio
``-log(1 - E)``; half the effect is half that log (the square root of the ratio: "x28.6"
halves to x5.3, not to 48 % saved). A claim of "at least" a number (``bound``) is
reproduced only where our estimate reaches the number itself. With fewer seeds a finding is **too few
seeds**, and a check whose side never ran is **not run**. A byte count that follows from the
configuration and the random draws alone (the same in every seed, or a check marked
``accounting``) is no test: **accounting**, listed with the paper's number beside ours and
left out of the families.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping, Sequence

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.05            # the family-wise error rate of each paper's family
POWER = 0.8             # the power :func:`seeds_needed` sizes a check for
REPRODUCED = 'reproduced'
SMALLER = 'smaller effect'
NO_EFFECT = 'no effect'
CONTRADICTED = 'contradicted'
LEANS_AGAINST = 'leans against'
UNDERPOWERED = 'underpowered'
FEW_SEEDS = 'too few seeds'
NOT_RUN = 'not run'
ACCOUNTING = 'accounting'
NOT_CHECKABLE = 'not checkable here'
FLAT = 'not checkable in this setting'   # zero spread: the setting cannot move the comparison
DECIDED = (REPRODUCED, SMALLER, NO_EFFECT, CONTRADICTED)
# The verdict columns of the summaries, in order.
COUNTED = (REPRODUCED, SMALLER, NO_EFFECT, CONTRADICTED, LEANS_AGAINST, UNDERPOWERED,
           FEW_SEEDS, NOT_RUN, FLAT)
HYPOTHESES = ('for', 'against', 'half')


@dataclasses.dataclass(frozen=True)
class Finding:
  """What a check measured.

  Attributes:
    holds: the one-sided test at the raw level (True, False, None: undecided or not run).
    detail: the numbers in words.
    n: paired seeds.
    mean: the mean per-seed difference, oriented so the claim is ``mean > margin``.
    margin: 0 for "exceeds", ``-tol`` for "not worse by more than tol".
    p: the one-sided p-value of the claim (H0: d <= margin).
    p_against: the one-sided p-value the other way (H0: d >= margin).
    relative: the effect relative to the baseline's mean (a bytes saving), if any.
    exact: both sides the same in every seed: a fixed quantity, not a test.
    flat: every seed the same difference (zero spread) in a learned quantity: no test.
    se: the standard error of ``mean`` (sample std / sqrt(n)).
    scale: what turns ``mean`` into the paper's units: the baseline's mean for a relative
      effect (``relative = mean / scale``), else 1.
    kind: what ``mean`` counts: ``'acc'`` (a fraction), ``'bytes'``, ``'ratio'`` (the log
      of the baseline's bytes over ours), ``'rounds'`` or ``'value'`` (another quantity, e.g.
      an entropy in bits).
  """
  holds: bool | None
  detail: str
  n: int = 0
  mean: float | None = None
  margin: float = 0.0
  p: float | None = None
  p_against: float | None = None
  relative: float | None = None
  exact: bool = False
  se: float | None = None
  scale: float = 1.0
  kind: str = 'acc'
  flat: bool = False

  def __iter__(self) -> Iterator:   # ``holds, detail = finding``
    yield self.holds
    yield self.detail

  def __getitem__(self, i: int):
    return (self.holds, self.detail)[i]

  @property
  def tested(self) -> bool:
    return self.p is not None and not self.exact and not self.flat


def in_units(f: Finding, paper_effect: float | None) -> float | None:
  """The paper's effect in the units of ``f.mean``: a bytes saving E as the log ratio
  ``-log(1 - E)`` for a ratio test, or E times the baseline's bytes for a difference; None
  without a number."""
  if paper_effect is None:
    return None
  if f.kind == 'ratio':
    return float(-np.log1p(-paper_effect)) if paper_effect < 1 else float('inf')
  return paper_effect * (f.scale if f.relative is not None else 1.0)


def half_threshold(f: Finding, paper_effect: float | None) -> float | None:
  """Half the paper's effect in the units of ``f.mean`` (None without a number)."""
  full = in_units(f, paper_effect)
  return None if full is None else full / 2


def target(f: Finding, paper_effect: float | None, bound: bool = False) -> float | None:
  """What our estimate must reach to reproduce the claim: half the paper's effect, or the
  paper's number itself for an "at least" claim (``bound``)."""
  return in_units(f, paper_effect) if bound else half_threshold(f, paper_effect)


def hypotheses(f: Finding, paper_effect: float | None) -> dict[str, float]:
  """The raw one-sided p-values of a tested finding: ``for``, ``against`` and, where the paper
  gives an effect, ``half`` (H0: mean(d) >= E/2)."""
  out = {'for': float(f.p), 'against': float(f.p_against)}
  thr = half_threshold(f, paper_effect)
  if thr is not None and thr > f.margin and f.se:
    out['half'] = float(scipy_stats.t.cdf((f.mean - thr) / f.se, f.n - 1))
  return out


def holm(ps: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the order given."""
  order = sorted(range(len(ps)), key=lambda i: ps[i])
  out = [1.0] * len(ps)
  running, m = 0.0, len(ps)
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * ps[i]))
    out[i] = running
  return out


def adjust(family: Sequence[Mapping[str, float]]) -> list[dict[str, float]]:
  """Holm over every hypothesis of a family (each member's ``{name: raw p}``): the adjusted
  p-values, member by member."""
  flat = [(i, k, p) for i, hyp in enumerate(family) for k, p in hyp.items()]
  out: list[dict[str, float]] = [{} for _ in family]
  for (i, k, _), q in zip(flat, holm([p for _, _, p in flat])):
    out[i][k] = q
  return out


def ours_effect(f: Finding) -> float | None:
  """Our effect in the units the paper's is given in (a ratio test's as the share saved)."""
  if f.kind == 'ratio' and f.mean is not None:
    return float(-np.expm1(-f.mean))
  return f.relative if f.relative is not None else f.mean


def verdict(f: Finding, adjusted: Mapping[str, float] | None, paper_effect: float | None,
            min_seeds: int, level: float = LEVEL, accounting: bool = False,
            bound: bool = False) -> str:
  """The verdict of a finding (the module docstring has the rule).

  Args:
    f: the finding.
    adjusted: its Holm-adjusted p-values by hypothesis (None: not in a family, e.g. fewer
      seeds than ``min_seeds``).
    paper_effect: the paper's effect in the finding's units (accuracy as a fraction; bytes
      as a relative saving); None for a margin claim or a claim without a number.
    min_seeds: the fewest paired seeds that decide.
    level: the family's level.
    accounting: the check is a byte count of the configuration and the draws.
    bound: the paper claims "at least" its number: reproduced only at that number.
  """
  if f.mean is None:
    return NOT_RUN if f.detail.startswith(('not run', 'diverged')) else FEW_SEEDS
  if f.exact or accounting:
    return ACCOUNTING
  if f.flat:
    return FLAT
  if f.p is None:
    return FEW_SEEDS
  if f.n < min_seeds or adjusted is None:
    return FEW_SEEDS
  if adjusted['against'] < level:
    return CONTRADICTED
  if adjusted['for'] < level:
    if paper_effect is None:
      return REPRODUCED
    return REPRODUCED if f.mean >= target(f, paper_effect, bound) else SMALLER
  if adjusted.get('half', 1.0) < level:
    return NO_EFFECT
  if f.mean < f.margin:
    return LEANS_AGAINST
  return UNDERPOWERED


@dataclasses.dataclass(frozen=True)
class Need:
  """How many seeds an underpowered check would need (:func:`seeds_needed`).

  Attributes:
    n: the fewest paired seeds (``most + 1`` beyond ``most``); None where no count is sized.
    decides: the verdict those seeds would most likely give.
    text: the sentence the report prints.
  """
  n: int | None
  decides: str
  text: str


def _power_n(delta: float, level: float, power: float, most: int) -> int:
  """The fewest n at which a one-sided t-test at ``level`` rejects with ``power`` when the
  true mean lies ``delta`` standard deviations beyond the null (noncentral t)."""
  for n in range(2, most + 1):
    crit = scipy_stats.t.ppf(1 - level, n - 1)
    if scipy_stats.nct.sf(crit, n - 1, delta * np.sqrt(n)) >= power:
      return n
  return most + 1


def _seeds(n: int, most: int) -> str:
  return f'more than {most:,} seeds' if n > most else f'about {n} seeds'


def seeds_needed(f: Finding, paper_effect: float | None, level: float,
                 power: float = POWER, most: int = 1000, bound: bool = False) -> Need:
  """How many paired seeds would decide an underpowered check at its measured spread, with
  ``power``, by the noncentral t distribution at one-sided ``level``:

  * our estimate at or above what reproducing needs (:func:`target`; for a margin claim no
    difference at all): the seeds that would reject *for* if the true mean were that target;
  * our estimate below the target: no seed count would reproduce the claim; the seeds that
    would decide it at the estimate as it stands (*for* rejected: smaller effect, or *half*
    rejected: no effect, whichever comes first);
  * no paper number and no margin: the seeds that would show the measured effect itself.

  ``n`` is None where the spread is unknown or the estimate sits on the margin.
  """
  if not f.se or f.n < 2:
    return Need(None, UNDERPOWERED, 'the spread is unknown')
  sd = f.se * np.sqrt(f.n)
  aim = target(f, paper_effect, bound)
  if aim is None and f.margin < 0:
    aim = 0.0
  if aim is None:   # no paper number: the measured effect is all there is to size by
    if f.mean <= f.margin:
      return Need(None, LEANS_AGAINST, 'no seed count: the estimate is not in the claimed '
                  'direction')
    n = _power_n((f.mean - f.margin) / sd, level, power, most)
    return Need(n, REPRODUCED, f'no paper effect to size by; {_seeds(n, most)} would show '
                'the measured effect at its spread')
  if f.mean >= aim:
    n = _power_n((aim - f.margin) / sd, level, power, most)
    what = ('no difference' if paper_effect is None else "the paper's number" if bound
            else "half the paper's effect")
    return Need(n, REPRODUCED, f'{_seeds(n, most)} would detect {what}')
  below = "the paper's number" if bound else "half the paper's effect"
  options = []
  if f.mean > f.margin:
    options.append((_power_n((f.mean - f.margin) / sd, level, power, most),
                    SMALLER if paper_effect is not None else REPRODUCED))
  half = half_threshold(f, paper_effect)
  if half is not None and half > f.mean:
    options.append((_power_n((half - f.mean) / sd, level, power, most), NO_EFFECT))
  if not options:
    return Need(None, LEANS_AGAINST, f'no seed count would reproduce it: our estimate is '
                f'below {below}')
  n, decides = min(options)
  return Need(n, decides, f'no seed count would reproduce it: our estimate is below {below}; '
              f'{_seeds(n, most)} would decide it as {decides} at this estimate and spread')
