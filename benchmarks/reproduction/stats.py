"""Paired statistics over seeds: a sweep's cells looked up by variant (:class:`Table`), the
one-sided paired t-test of a directional claim (:func:`directional`) and the two one-sided
tests of an equivalence (:func:`equivalence`), with the number formats their texts use.

The check builders of :mod:`benchmarks.reproduction.checks` compare variants through these.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from scipy import stats as scipy_stats

from benchmarks.reproduction.verdicts import Finding
from fedjax_kd.running import results

MIN_PAIRED_SEEDS = 3    # a paired comparison with fewer seeds decides nothing


Ref = Any   # a variant label, or (label, {grid field: value})


class Table:
  """A sweep's aggregated cells (:func:`fedjax_kd.sweep.aggregate`), looked up by label."""

  def __init__(self, cells: Sequence[dict[str, Any]]):
    self.cells = list(cells)

  def find(self, ref: Ref) -> dict[str, Any] | None:
    """The cell of a variant label, or of ``(label, {field: value})``; None if absent."""
    label, grid = (ref, {}) if isinstance(ref, str) else ref
    for c in self.cells:
      if c['variant'] == label and all(c['cell'].get(k) == v for k, v in grid.items()):
        return c
    return None

  def stat(self, ref: Ref, key: str) -> dict[str, Any] | None:
    """The :func:`fedjax_kd.running.results.stat` of ``key`` for ``ref``; None if not run or not logged.

    ``key`` is a statistic of the sweep's cells (``final_acc``, ``total_bytes``, a metric's
    mean over rounds, ...) or one derived from the per-seed curves:
    ``final:<metric>`` (its last logged value), ``acc_at:<r>`` (the headline accuracy at
    round r), ``best_by:<r>`` (the best headline accuracy up to round r) or ``decline``
    (best minus final headline accuracy: what a run lost after its peak).
    """
    c = self.find(ref)
    if c is None or not c['n']:
      return None
    s = derived(c, key) if key in DERIVED or ':' in key else c['stats'].get(key)
    return s if s and s['mean'] is not None else None


DERIVED = ('decline',)


def derived(cell: dict[str, Any], key: str) -> dict[str, Any]:
  """A per-seed statistic of ``cell`` computed from its curves (see :meth:`Table.stat`)."""
  kind, _, arg = key.partition(':')
  vals = {}
  for seed, curves in cell['curves'].items():
    if seed not in cell['stats']['final_acc']['values']:
      continue
    if kind == 'decline':
      st = cell['stats']
      vals[seed] = st['best_acc']['values'][seed] - st['final_acc']['values'][seed]
      continue
    series = curves.get(arg if kind == 'final' else 'test_acc')
    if series is None or not len(series['acc']):
      continue
    rounds, acc = np.asarray(series['round']), np.asarray(series['acc'], np.float64)
    if kind == 'final':
      vals[seed] = float(acc[-1])
    elif kind == 'acc_at':
      hit = np.flatnonzero(rounds == int(arg))
      if len(hit):
        vals[seed] = float(acc[hit[0]])
    elif kind == 'best_by':
      upto = acc[rounds <= int(arg)]
      if len(upto):
        vals[seed] = float(upto.max())
    else:
      raise ValueError(f'unknown statistic {key!r}')
  return results.stat(vals)


def paired(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
  """Per-seed differences ``a - b`` over the seeds both have, as a :func:`fedjax_kd.running.results.stat`."""
  va, vb = a['values'], b['values']
  return results.stat({s: va[s] - vb[s] for s in va if s in vb})


# kind -> (scale, decimals, unit) of a number in a check's text: accuracy, bytes in MB,
# rounds, or another value (an entropy in bits).
UNITS = {'acc': (1.0, 3, ''), 'bytes': (results.MB, 2, ' MB'), 'rounds': (1.0, 1, ' rounds'),
         'value': (1.0, 3, ''), 'ratio': (1.0, 3, '')}   # ratio: a natural log


def fmt_delta(d: dict[str, Any], kind: str = 'acc') -> str:
  if d['mean'] is None:
    return '–'
  scale, digits, _ = UNITS[kind]
  std = '–' if d['std'] is None else f'{d["std"] / scale:.{digits}f}'
  return f'{d["mean"] / scale:+.{digits}f} ± {std}'


# Per-seed differences that spread less than this (relative) are one difference: a - b over
# seeds of a constant gap leaves only the rounding of the subtraction (about 1e-16).
FLAT_TOL = 1e-9
MIN_CLAIM_SEEDS = 5     # a paper claim's verdict: at least five paired seeds
CLAIM_LEVEL = 0.05      # ... and the claimed direction at p < 0.05 (one-sided paired t-test)


def fmt_p(p: float) -> str:
  return '< 0.001' if p < 0.0005 else f'= {p:.3f}'


def signed(v: float, digits: int = 3) -> str:
  return f'{round(v, digits) or 0.0:+.{digits}f}'   # no "-0.000"


def _interval(diffs: dict[int, float], level: float,
              kind: str = 'acc') -> tuple[int, float, float, str]:
  """Paired per-seed differences (at least two): ``(n, mean, SE, text)``, the text
  "mean ± std (n; SE; (1 - 2 level) CI [lo, hi])" that :func:`directional` and
  :func:`equivalence` report (a t interval with n - 1 degrees of freedom)."""
  x = np.asarray(list(diffs.values()), np.float64)
  n, m = len(x), float(x.mean())
  sd = float(x.std(ddof=1))
  se = sd / np.sqrt(n)
  half = float(scipy_stats.t.ppf(1.0 - level, n - 1)) * se
  scale, digits, unit = UNITS[kind]
  f = lambda v: signed(v / scale, digits)
  conf = round(100 * (1 - 2 * level))
  return n, m, se, (f'{f(m)} ± {sd / scale:.{digits}f}{unit} (n={n}; SE '
                    f'{se / scale:.{digits}f}; {conf}% CI [{f(m - half)}, {f(m + half)}])')


def directional(diffs: dict[int, float], margin: float = 0.0, kind: str = 'acc',
                level: float = CLAIM_LEVEL,
                min_seeds: int = MIN_CLAIM_SEEDS) -> Finding:
  """Whether paired per-seed differences ``d`` show ``mean(d) > margin``: a one-sided t-test.

  With n seeds, mean m and SE = std / sqrt(n), t = (m - margin) / SE has n - 1 degrees of
  freedom under the null ``mean(d) <= margin``; p = P(T >= t), and the other way
  P(T <= t). The text also gives the (1 - 2 level) two-sided confidence interval of the
  mean, whose lower end is the one-sided test's bound: the claim holds exactly when that
  end lies above ``margin``.

  * Holds: p < ``level`` with at least ``min_seeds`` seeds.
  * Does not hold: p >= ``level`` with at least ``min_seeds`` seeds.
  * None: fewer than ``min_seeds`` seeds (the text says how many ran).

  Every seed the same difference (SE 0) is no test: for bytes (a count fixed by the
  configuration) the finding is marked ``exact`` (accounting), for a learned quantity
  ``flat`` (not checkable in this setting: identical sides, or a switch the setting never
  moves); the sign is reported, never tested.

  Args:
    diffs: ``{seed: a - b}`` oriented so that the claim is ``a - b > margin``.
    margin: 0 for "exceeds"; ``-tol`` for "not worse by more than tol" (non-inferiority).
    kind: ``'acc'`` (3 decimals), ``'bytes'`` (shown in MB), ``'ratio'`` (a log ratio of
      bytes), ``'rounds'`` or ``'value'``.
    level: the test's level.
    min_seeds: the fewest paired seeds that decide.

  Returns:
    A :class:`Finding` (``holds, text = finding``) with mean ± std, n, SE, the interval and p.
  """
  if not diffs:
    return Finding(None, 'no paired seeds')
  scale, digits, unit = UNITS[kind]
  if len(diffs) < 2:
    m = next(iter(diffs.values()))
    return Finding(None, f'{signed(m / scale, digits)}{unit} (n=1); one seed decides nothing',
                   n=1, mean=m, margin=margin)
  n, m, se, text = _interval(diffs, level, kind)
  x = np.asarray(list(diffs.values()), np.float64)
  if np.ptp(x) <= FLAT_TOL * max(1.0, float(np.abs(x).max())):
    se = 0.0   # the same difference in every seed, up to the rounding of a subtraction
  if se > 0:
    t = (m - margin) / se
    p, p_against = float(scipy_stats.t.sf(t, n - 1)), float(scipy_stats.t.cdf(t, n - 1))
  else:   # every seed the same difference: nothing to test (p stays 1 both ways)
    p, p_against = 1.0, 1.0
  se = float(se)
  exact = bool(se == 0 and kind in ('bytes', 'ratio'))   # a byte count fixed by the configuration
  flat = bool(se == 0 and not exact)
  null = f'{signed(margin / scale, digits)}{unit}' if margin else '0'
  if exact:
    text += '; every seed the same: a count fixed by the configuration, no test'
  elif flat:
    text += ('; every seed the same difference' + (' (the two sides bit-identical)' if m == 0
                                                   else '') + ': no spread, no test')
  else:
    text += f'; one-sided paired t-test, H0: d ≤ {null}: p {fmt_p(p)}'
  if n < min_seeds:
    return Finding(None, text + f'; n < {min_seeds}: more seeds decide', n=n, mean=m,
                   margin=margin, p=p, p_against=p_against, exact=exact, se=se, kind=kind,
                   flat=flat)
  holds = (m > margin) if exact else None if flat else p < level
  return Finding(holds, text, n=n, mean=m, margin=margin, p=p, p_against=p_against,
                 exact=exact, se=se, kind=kind, flat=flat)


EQUIVALENCE_LEVEL = 0.05   # each one-sided test of :func:`equivalence`


def equivalence(diffs: dict[int, float], tol: float,
                level: float = EQUIVALENCE_LEVEL) -> tuple[bool | None, str]:
  """Whether paired per-seed differences are within ``±tol``, by two one-sided t-tests.

  With n seeds, mean m and standard error SE = std / sqrt(n), the (1 - 2 level) confidence
  interval of the mean difference is m ± t(1 - level, n - 1) SE.

  * Within the margin (equivalence, TOST): the interval lies inside ``[-tol, tol]``, i.e.
    both nulls "d <= -tol" and "d >= tol" are rejected at ``level``; p is the larger of
    the two one-sided p-values.
  * Apart: the interval lies wholly beyond ``tol`` (or ``-tol``): "|d| <= tol" is rejected
    at ``level`` in the sign of m; p is that one-sided p-value.
  * Otherwise undecided: the seeds cannot tell a gap of ``tol`` from none.

  Args:
    diffs: ``{seed: a - b}``, at least two seeds.
    tol: the margin (accuracy, e.g. 0.02).
    level: the level of each one-sided test.

  Returns:
    ``(True | False | None, text)``: the text gives the mean ± std, n, SE, the interval, the
    margin and the p-value of the test that decided (or both with no decision).
  """
  n, m, se, text = _interval(diffs, level)
  if se > 0:
    p_in = float(max(scipy_stats.t.sf((m + tol) / se, n - 1),
                     scipy_stats.t.cdf((m - tol) / se, n - 1)))
    p_out = float(scipy_stats.t.sf((abs(m) - tol) / se, n - 1))
  else:   # every seed the same difference: the margin decides exactly
    p_in, p_out = (0.0, 1.0) if abs(m) <= tol else (1.0, 0.0)
  text += f'; margin ±{tol:g}; '
  if p_in < level:
    return True, text + f'within it: TOST p = {p_in:.3f}'
  if p_out < level:
    return False, text + f'beyond it: p = {p_out:.3f}'
  return None, text + (f'undecided (TOST p = {p_in:.3f}; beyond-margin p = {p_out:.3f}): '
                       + _seeds_to_decide(m, se * np.sqrt(n), tol, level))


def _seeds_to_decide(m: float, sd: float, tol: float, level: float) -> str:
  """How many seeds would put the interval inside the margin if the mean and spread stayed
  what they are (the smallest n with ``|m| + t(1 - level, n - 1) sd / sqrt(n) < tol``)."""
  if abs(m) >= tol:
    return 'more seeds decide'
  for n in range(2, 1001):
    if abs(m) + float(scipy_stats.t.ppf(1.0 - level, n - 1)) * sd / np.sqrt(n) < tol:
      return f'at this mean and spread about {n} seeds would show equivalence'
  return 'more than 1,000 seeds at this spread'


def values_at_round(cell: dict[str, Any], metric: str, r: int) -> dict[int, float]:
  """``{seed: value}`` of ``metric`` at round ``r`` over a cell's seeds that logged it."""
  vals = {}
  for seed, cv in cell['curves'].items():
    hit = np.nonzero(cv[metric]['round'] == r)[0]
    if len(hit):
      vals[seed] = cv[metric]['acc'][hit[0]]
  return vals
