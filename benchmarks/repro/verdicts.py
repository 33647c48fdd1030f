"""Verdicts with a size: a paper's claim against our paired seeds, adjusted for the number of
claims tested.

A statistical check of a claim yields a :class:`Finding`: the per-seed differences oriented so
that the claim reads ``mean(d) > margin``, their one-sided p-values both ways, and (for bytes)
the relative saving. Over all the findings of the report (the family), Holm's step-down
method adjusts each finding's deciding p (the smaller of its two one-sided p-values), which
keeps the chance of any false verdict in the family (a paper's checks) at 5%. Then, with at least
``min_seeds`` paired seeds:

* **reproduced**: adjusted p < 0.05 in the claimed direction, and at least half the paper's
  effect (or, for a margin claim such as "within 1 point", the interval inside the margin);
* **smaller effect**: adjusted p < 0.05 in the claimed direction, less than half the paper's
  effect;
* **contradicted**: adjusted p < 0.05 the other way (for a margin claim: the interval lies
  wholly beyond the margin);
* **not significant**: neither.

With fewer seeds a finding is **too few seeds**, and a check whose side never ran is **not
run**. A finding whose sides have no spread at all (bytes fixed by the configuration) is no
test: it is **exact by construction**, reported in a table of its own with the paper's
number beside ours, and left out of the family.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

LEVEL = 0.05
REPRODUCED = 'reproduced'
SMALLER = 'smaller effect'
NOT_SIGNIFICANT = 'not significant'
CONTRADICTED = 'contradicted'
FEW_SEEDS = 'too few seeds'
NOT_RUN = 'not run'
EXACT = 'exact by construction'
NOT_CHECKABLE = 'not checkable here'
# The README's columns, in order.
COUNTED = (REPRODUCED, SMALLER, NOT_SIGNIFICANT, CONTRADICTED, NOT_CHECKABLE)


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

  def __iter__(self) -> Iterator:   # ``holds, detail = finding``
    yield self.holds
    yield self.detail

  def __getitem__(self, i: int):
    return (self.holds, self.detail)[i]

  @property
  def tested(self) -> bool:
    return self.p is not None and not self.exact

  @property
  def deciding_p(self) -> float:
    return min(self.p, self.p_against)


def holm(ps: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values, in the order given."""
  order = sorted(range(len(ps)), key=lambda i: ps[i])
  out = [1.0] * len(ps)
  running, m = 0.0, len(ps)
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * ps[i]))
    out[i] = running
  return out


def verdict(f: Finding, p_adj: float | None, paper_effect: float | None,
            min_seeds: int, level: float = LEVEL) -> str:
  """The four-way verdict of a finding (see the module docstring).

  Args:
    f: the finding.
    p_adj: its Holm-adjusted deciding p (None: not in the family).
    paper_effect: the paper's effect in the finding's units (accuracy as a fraction; bytes
      as a relative saving); None for a margin claim or a claim without a number.
    min_seeds: the fewest paired seeds that decide.
    level: the family's level.
  """
  if f.exact:
    return EXACT
  if f.mean is None or f.p is None:
    return NOT_RUN if f.detail.startswith(('not run', 'diverged')) else FEW_SEEDS
  if f.n < min_seeds:
    return FEW_SEEDS
  if p_adj is None or p_adj >= level:
    return NOT_SIGNIFICANT
  if f.mean < f.margin:
    return CONTRADICTED
  if paper_effect is None:
    return REPRODUCED
  ours = f.relative if f.relative is not None else f.mean
  return REPRODUCED if ours >= paper_effect / 2 else SMALLER


def ours_effect(f: Finding) -> float | None:
  """Our effect in the units the paper's is given in."""
  return f.relative if f.relative is not None else f.mean
