"""A claim tested on one sweep's table (:class:`Check`) and the builders of its test,
``Table -> (holds, detail)``.

A paper's claims: :func:`exceeds`, :func:`lower`, :func:`not_worse`,
:func:`fewer_bytes_to_threshold`, :func:`grid_trend` (one-sided paired t-tests,
:func:`benchmarks.reproduction.stats.directional`). fedjax_kd against a reference or a setting
(marked by :func:`implementation`): :func:`matches`, :func:`no_steady_gap`,
:func:`same_metric`, :func:`within_draw_noise`, :func:`stable`, and :func:`pair_checks`,
which builds the usual set for one pair.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.reproduction.stats import (MIN_PAIRED_SEEDS, UNITS, Ref, Table, directional,
                                           equivalence, fmt_delta, paired, values_at_round)
from benchmarks.reproduction.verdicts import Finding
from fedjax_kd import sweep
from fedjax_kd.running import results

@dataclasses.dataclass(frozen=True)
class Check:
  """A claim tested on one sweep's table.

  Attributes:
    claim: the sentence, e.g. "ERA's final server accuracy exceeds SA's".
    sweep: the name of the sweep it reads.
    fn: ``Table -> (holds, detail)``: True, False or None (inconclusive or
      not run) and the numbers behind it; a :class:`Finding` for a statistical test.
    claim_id: the claim of the register (:mod:`benchmarks.reproduction.claims`) it tests; ''
      for a check of fedjax_kd against a reference or of a setting.
    arbiter: the check tests the claim in an independent implementation (the authors'
      code, a PyTorch reference): it is shown under the claim and decides whether a
      verdict is an implementation's or the scale's, and is not counted as a verdict.
    effect: the paper's effect in the check's units (an accuracy difference as a fraction,
      a bytes saving as a share of the baseline's); None for a margin claim or a claim
      without a number.
    effect_text: the paper's number behind ``effect``, as the report prints it.
    accounting: a byte count that follows from the configuration and the random draws
      alone (not from what the models learn): listed in the accounting table with the
      paper's number, no test and no verdict.
    at_least: the paper claims "at least" its number: reproduced only where our estimate
      reaches that number, not half of it.
  """
  claim: str
  sweep: str
  fn: Callable[['Table'], tuple[bool | None, str]]
  claim_id: str = ''
  arbiter: bool = False
  effect: float | None = None
  effect_text: str = ''
  accounting: bool = False
  at_least: bool = False

  @property
  def paper_claim(self) -> bool:
    """A claim of the paper (or the paper's claim in a reference); False for a check of
    fedjax_kd's agreement with a reference or of a setting (:func:`implementation`)."""
    return not getattr(self.fn, 'implementation', False)


def implementation(fn: Callable) -> Callable:
  """Marks a check function as one on fedjax_kd's agreement with a reference or on a setting
  (the report lists it apart from the papers' claims)."""
  fn.implementation = True
  return fn


def _name(ref: Ref) -> str:
  if isinstance(ref, str):
    return ref
  return f'{ref[0]} ({sweep.cell_label(list(ref[1].items()))})'


def _fmt(s: dict[str, Any] | None, kind: str = 'acc') -> str:
  return results.fmt_stat(s, kind)


def _missing(t: Table, refs: Sequence[Ref], key: str) -> str | None:
  """Why a check cannot be decided: a side never ran, or diverged in some seed."""
  div = [f'{_name(r)} in seed{"s" if len(d) > 1 else ""} {", ".join(map(str, sorted(d)))}'
         for r in refs for d in [(t.find(r) or {}).get('diverged') or {}] if d]
  if div:   # a comparison over the seeds that did not diverge would flatter the method
    return 'diverged (a round left NaN or Inf): ' + '; '.join(div)
  gone = [_name(r) for r in refs if t.stat(r, key) is None]
  return f'not run: {", ".join(gone)}' if gone else None


def _saving(sa: dict[str, Any], sb: dict[str, Any]) -> float | None:
  """``1 - mean(a) / mean(b)``: the share of ``b``'s bytes that ``a`` saves."""
  return 1.0 - sa['mean'] / sb['mean'] if sb['mean'] else None


def _log_ratio(va: dict[int, float], vb: dict[int, float]) -> dict[int, float] | str:
  """Per seed ``log(b / a)``: how many times ``a``'s bytes ``b`` sends, on the log scale a
  ratio claim is tested on; a reason where a side counts no bytes in some seed."""
  seeds = [s for s in va if s in vb and vb[s] is not None]
  zero = [s for s in seeds if not (va[s] > 0 and vb[s] > 0)]
  if zero:
    return f'no ratio: a side counts no bytes in seed {", ".join(map(str, zero))}'
  return {s: float(np.log(vb[s] / va[s])) for s in seeds}


def _by_ratio(va: dict[int, float], vb: dict[int, float], sa: dict[str, Any],
              sb: dict[str, Any], detail: str) -> Finding:
  """The ratio test of a bytes saving (``a`` sends fewer bytes than ``b``): :func:`directional`
  on the per-seed log ratios, after ``detail`` (the two sides' bytes)."""
  logs = _log_ratio(va, vb)
  if isinstance(logs, str):
    return Finding(None, f'{detail}; {logs}')
  f = directional(logs, 0.0, 'ratio')
  geo = '' if f.mean is None else f'; geometric mean ratio x{np.exp(f.mean):.2f}'
  return dataclasses.replace(f, detail=f'{detail}; paired log ratio {f.detail}{geo}',
                             relative=_saving(sa, sb), scale=sb['mean'] or 1.0)


def _ratio(sa: dict[str, Any], sb: dict[str, Any]) -> str:
  return f'; ratio {sa["mean"] / sb["mean"]:.3f}' if sb['mean'] else ''


def _versus(t: Table, a: Ref, b: Ref, key: str, kind: str) -> str:
  unit = UNITS[kind][2]
  return (f'{_name(a)} {_fmt(t.stat(a, key), kind)}{unit} vs {_name(b)} '
          f'{_fmt(t.stat(b, key), kind)}{unit}')


def exceeds(a: Ref, b: Ref, key: str = 'final_acc', kind: str = 'acc',
            margin: float = 0.0, key_b: str | None = None) -> Callable[[Table], tuple]:
  """``a`` exceeds ``b`` by more than ``margin``: :func:`directional` on the per-seed ``a - b``
  (``a``'s ``key`` against ``b``'s ``key_b``, by default the same statistic)."""
  key_b = key_b or key

  def fn(t: Table):
    miss = _missing(t, (a,), key) or _missing(t, (b,), key_b)
    if miss:
      return None, miss
    f = directional(paired(t.stat(a, key), t.stat(b, key_b))['values'], margin, kind)
    versus = (_versus(t, a, b, key, kind) if key_b == key else
              f'{_name(a)} {_fmt(t.stat(a, key), kind)} ({key}) vs {_name(b)} '
              f'{_fmt(t.stat(b, key_b), kind)} ({key_b})')
    return dataclasses.replace(f, detail=f'{versus}; paired difference {f.detail}')
  return fn


def smaller_drop(a: Ref, a_clean: Ref, b: Ref, b_clean: Ref,
                 key: str = 'best_acc') -> Callable[[Table], tuple]:
  """``a`` loses less than ``b`` when the setting is degraded: per seed
  ``(b_clean - b) - (a_clean - a)`` > 0 by :func:`directional` (``x_clean`` is ``x`` in the
  undegraded cell of the same sweep, e.g. DS-FL's ERA and SA without noisy labels)."""
  def fn(t: Table):
    refs = (a, a_clean, b, b_clean)
    miss = _missing(t, refs, key)
    if miss:
      return None, miss
    v = [t.stat(r, key)['values'] for r in refs]
    seeds = set.intersection(*(set(x) for x in v))
    drop = lambda x, x0: {s: x0[s] - x[s] for s in seeds}
    da, db = drop(v[0], v[1]), drop(v[2], v[3])
    f = directional({s: db[s] - da[s] for s in seeds}, 0.0)
    sa, sb = results.stat(da), results.stat(db)
    return dataclasses.replace(f, detail=(
        f'drop of {_name(a)} from {_name(a_clean)} {_fmt(sa)} vs drop of {_name(b)} from '
        f'{_name(b_clean)} {_fmt(sb)} ({key}); paired difference of the drops {f.detail}'))
  return fn


def above(ref: Ref, key: str, value: float, what: str) -> Callable[[Table], tuple]:
  """``ref``'s ``key`` exceeds the constant ``value`` (``what`` names it): a one-sample
  :func:`directional` on the per-seed ``key - value``."""
  def fn(t: Table):
    miss = _missing(t, (ref,), key)
    if miss:
      return None, miss
    s = t.stat(ref, key)
    f = directional({k: v - value for k, v in s['values'].items()}, 0.0, 'value')
    return dataclasses.replace(f, detail=(f'{_name(ref)} {key} {_fmt(s)} against {what} '
                                          f'{value:.3f}; difference {f.detail}'))
  return fn


def _to_threshold(t: Table, a: Ref, b: Ref, what: str, unreached: str,
                  value_if_unreached: Callable[[dict[str, Any], int], float]):
  """The per-seed ``what`` (``'rounds'`` or ``'bytes'``) of ``a`` and ``b`` to the highest
  threshold that ``a`` reaches in every seed and ``b`` in at least one; a seed in which ``b``
  never reaches it counts ``value_if_unreached(b's cell, seed)``, a lower bound on what ``b``
  would need (so a gain is understated, never flattered).

  Returns:
    ``(threshold, a's values, b's values, words on the seeds counted so)``, or a
    :class:`Finding` saying why there is no such threshold.
  """
  ca, cb = t.find(a), t.find(b)
  if ca is None or cb is None or not ca['n'] or not cb['n']:
    return Finding(None, 'not run: ' + ', '.join(_name(r) for r, c in ((a, ca), (b, cb))
                                                if c is None or not c['n']))
  both = [x for x in ca['thresholds']
          if ca['reached'][f'{x:g}'][0] == ca['n'] and cb['reached'][f'{x:g}'][0] > 0]
  if not both:
    return Finding(None, f'no threshold ({", ".join(f"{x:g}" for x in ca["thresholds"])}) '
                   f'reached by {_name(a)} in every seed and by {_name(b)} in one')
  x = max(both)
  va = dict(ca['stats'][f'{what}_to_{x:g}']['values'])
  vb = dict(cb['stats'][f'{what}_to_{x:g}']['values'])
  done = cb['stats']['final_acc']['values']
  censored = sorted(s for s in va if s in done and vb.get(s) is None)
  for s in censored:
    vb[s] = value_if_unreached(cb, s)
  cens = (f'; {_name(b)} never reached it in seed{"s" if len(censored) > 1 else ""} '
          f'{", ".join(map(str, censored))}: counted at {unreached}' if censored else '')
  return x, va, vb, cens


def fewer_rounds_to_threshold(a: Ref, b: Ref) -> Callable[[Table], tuple]:
  """``a`` reaches an accuracy threshold in fewer rounds than ``b``: :func:`directional` on the
  per-seed rounds ``b - a`` to the highest threshold that ``a`` reaches in every seed and ``b``
  in at least one; a seed in which ``b`` never reaches it counts ``b``'s rounds plus one
  (:func:`_to_threshold`)."""
  def fn(t: Table):
    got = _to_threshold(t, a, b, 'rounds', 'its rounds + 1',
                        lambda c, s: c['stats']['rounds']['values'][s] + 1)
    if isinstance(got, Finding):
      return got
    x, va, vb, cens = got
    f = directional({s: vb[s] - va[s] for s in va if s in vb}, 0.0, 'rounds')
    return dataclasses.replace(f, detail=(
        f'rounds to {x:g}: {_name(a)} {_fmt(results.stat(va), "num")} vs {_name(b)} '
        f'{_fmt(results.stat(vb), "num")}{cens}; paired difference {f.detail}'))
  return fn


def bytes_ratio(a: Ref, b: Ref, key: str = 'bytes_per_round') -> Callable[[Table], tuple]:
  """``a``'s bytes over ``b``'s, for the accounting table (a count, no test)."""
  def fn(t: Table):
    miss = _missing(t, (a, b), key)
    if miss:
      return None, miss
    sa, sb = t.stat(a, key), t.stat(b, key)
    return Finding(None, f'{_versus(t, a, b, key, "bytes")}{_ratio(sa, sb)}', n=sa['n'],
                   mean=sb['mean'] - sa['mean'], relative=_saving(sa, sb), exact=True,
                   scale=sb['mean'] or 1.0)
  return fn


def lower(a: Ref, b: Ref, key: str = 'total_bytes', kind: str = 'bytes') -> Callable:
  """``a`` is below ``b``: for bytes, the ratio test (:func:`directional` on the per-seed
  ``log(b / a)``); for another quantity, :func:`directional` on the per-seed ``b - a``."""
  def fn(t: Table):
    miss = _missing(t, (a, b), key)
    if miss:
      return None, miss
    sa, sb = t.stat(a, key), t.stat(b, key)
    if kind == 'bytes':
      return _by_ratio(sa['values'], sb['values'], sa, sb,
                       f'{_versus(t, a, b, key, kind)}{_ratio(sa, sb)}')
    f = directional(paired(sb, sa)['values'], 0.0, kind)
    return dataclasses.replace(
        f, detail=f'{_versus(t, a, b, key, kind)}{_ratio(sa, sb)}; paired saving {f.detail}',
        relative=_saving(sa, sb), scale=sb['mean'] or 1.0)
  return fn


def not_worse(a: Ref, b: Ref, tol: float = 0.01, key: str = 'final_acc') -> Callable:
  """``a`` is not worse than ``b`` by ``tol`` or more (non-inferiority): the per-seed
  ``a - b`` exceeds ``-tol`` by :func:`directional`."""
  return exceeds(a, b, key, margin=-tol)


def fewer_bytes_to_threshold(a: Ref, b: Ref, after_setup: bool = False) -> Callable:
  """``a`` reaches an accuracy threshold with fewer bytes than ``b``: :func:`directional` on
  the per-seed bytes ``b - a`` to the highest threshold that ``a`` reaches in every seed and
  ``b`` in at least one.

  A seed in which ``b`` never reaches it counts ``b``'s total bytes (a lower bound on what
  ``b`` would need, so the saving is understated, never flattered); the detail names those
  seeds. ``after_setup``: leave out the one-time bytes before round 1 on both sides (the
  paper's own measure, e.g. DS-FL's cumulative cost to a target accuracy excludes the
  open-data broadcast).
  """
  def fn(t: Table):
    got = _to_threshold(t, a, b, 'bytes', 'its total bytes',
                        lambda c, s: c['stats']['total_bytes']['values'][s])
    if isinstance(got, Finding):
      return got
    x, va, vb, cens = got
    note = ''
    if after_setup:
      sa, sb = (t.find(r)['stats']['setup_bytes']['values'] for r in (a, b))
      va = {s: v - sa[s] for s, v in va.items() if s in sa}
      vb = {s: v - sb[s] for s, v in vb.items() if s in sb and v is not None}
      note = ' after the one-time setup bytes'
    sta, stb = results.stat(va), results.stat(vb)
    return _by_ratio(va, vb, sta, stb, (
        f'to reach {x:g}{note}: {_name(a)} {_fmt(sta, "bytes")} MB vs {_name(b)} '
        f'{_fmt(stb, "bytes")} MB{_ratio(sta, stb)}{cens}'))
  return fn


def grid_trend(label: str, field: str, key: str = 'total_bytes', kind: str = 'bytes',
               decreasing: bool = True) -> Callable:
  """``key`` at the largest grid value is below (above) the smallest one's: :func:`directional`
  on the per-seed difference between the two cells."""
  def fn(t: Table):
    cells = [c for c in t.cells if c['variant'] == label and field in c['cell'] and c['n']]
    if len(cells) < 2:
      return None, f'not run: fewer than two {field} values'
    cells.sort(key=lambda c: c['cell'][field])
    lo, hi = cells[0], cells[-1]
    sl, sh = lo['stats'][key], hi['stats'][key]
    if sl['mean'] is None or sh['mean'] is None:
      return None, 'not logged'
    unit = UNITS[kind][2]
    versus = (f'{field}={hi["cell"][field]}: {_fmt(sh, kind)}{unit} vs '
              f'{field}={lo["cell"][field]}: {_fmt(sl, kind)}{unit}')
    if kind == 'bytes' and decreasing:
      return _by_ratio(sh['values'], sl['values'], sh, sl, versus)
    d = paired(sl, sh) if decreasing else paired(sh, sl)
    f = directional(d['values'], 0.0, kind)
    return dataclasses.replace(
        f, detail=f'{versus}; paired {"saving" if decreasing else "difference"} {f.detail}',
        relative=_saving(sh, sl) if decreasing else None, scale=sl['mean'] or 1.0)
  return fn


def _equivalent(d: dict[str, Any], tol: float, detail: str) -> tuple[bool | None, str]:
  """Paired differences ``d`` (a :func:`fedjax_kd.running.results.stat`) within ``±tol`` by
  :func:`equivalence`, its text after ``detail``; None with fewer than
  :data:`MIN_PAIRED_SEEDS` seeds."""
  if d['n'] < MIN_PAIRED_SEEDS:
    return None, (detail + f'{fmt_delta(d)} (n={d["n"]}); tolerance ±{tol:g}; fewer than '
                  f'{MIN_PAIRED_SEEDS} paired seeds')
  holds, test = equivalence(d['values'], tol)
  return holds, detail + test


def matches(a: Ref, b: Ref, at_round: int | None = None, tol: float = 0.02) -> Callable:
  """``a`` reaches the accuracy ``b`` reaches: the per-seed difference ``a - b`` at round
  ``at_round`` (default: the final round) is within ``±tol``, decided by :func:`equivalence`
  (None with fewer than :data:`MIN_PAIRED_SEEDS` seeds)."""
  def fn(t: Table):
    miss = _missing(t, (a, b), 'final_acc')
    if miss:
      return None, miss
    if at_round is None:
      sa, sb = t.stat(a, 'final_acc'), t.stat(b, 'final_acc')
    else:
      sa, sb = (results.stat(values_at_round(t.find(r), 'test_acc', at_round)) for r in (a, b))
    d = paired(sa, sb)
    where = 'final' if at_round is None else f'round {at_round}'
    if d['mean'] is None:
      return None, f'not logged at {where}'
    detail = f'{where}: {_name(a)} {_fmt(sa)} vs {_name(b)} {_fmt(sb)}; paired difference '
    return _equivalent(d, tol, detail)
  return implementation(fn)


def stable(ref: Ref, floor: float = 0.5) -> Callable:
  """Every seed of ``ref`` finished (no NaN or Inf) with a final accuracy of at least
  ``floor`` (a model that collapsed to one class sits near 0.1)."""
  def fn(t: Table):
    c = t.find(ref)
    if c is None or not (c['n'] or c.get('diverged')):
      return None, f'not run: {_name(ref)}'
    finals = c['stats']['final_acc']['values'] if c['n'] else {}
    low = sorted(s for s, v in finals.items() if v < floor)
    div = sorted(c.get('diverged', {}))
    ran = len(finals) + len(div)
    detail = (f'{_name(ref)}: {len(finals)} of {c["planned"]} seeds finished, '
              f'final acc {_fmt(t.stat(ref, "final_acc"))}'
              + (f'; diverged: seeds {", ".join(map(str, div))}' if div else '')
              + (f'; below {floor:g}: seeds {", ".join(map(str, low))}' if low else ''))
    if div or low:
      return False, detail
    if ran < max(c['planned'], MIN_PAIRED_SEEDS):
      return None, detail + f'; {ran} of {c["planned"]} seeds ran'
    return True, detail
  return implementation(fn)


def _paired_rounds(ca: dict[str, Any], cb: dict[str, Any], metric: str,
                   from_round: int = 1) -> dict[int, list[tuple[float, float]]]:
  """Per seed both cells ran, ``(a, b)`` values of ``metric`` at every round from
  ``from_round`` that both logged (seeds without the metric or a shared round are left out)."""
  out = {}
  for seed in sorted(set(ca['curves']) & set(cb['curves'])):
    xa, xb = ca['curves'][seed].get(metric), cb['curves'][seed].get(metric)
    if xa is None or xb is None:
      continue
    rb = {int(r): v for r, v in zip(xb['round'], xb['acc'])}
    pairs = [(float(v), float(rb[int(r)])) for r, v in zip(xa['round'], xa['acc'])
             if int(r) >= from_round and int(r) in rb]
    if pairs:
      out[seed] = pairs
  return out


def no_steady_gap(a: Ref, b: Ref, from_round: int = 2, tol: float = 0.01) -> Callable:
  """``a`` does not trail (or lead) ``b`` steadily: per seed, the mean of ``a - b`` over
  every round from ``from_round`` on that both logged; then mean ± std over seeds.

  A one-round gap can be a draw's accident; a steady lag shows in every seed's average over
  the whole curve. Decided by :func:`equivalence` over at least :data:`MIN_PAIRED_SEEDS`
  seeds (None with fewer). The detail also counts the rounds ``a`` is lower.
  """
  def fn(t: Table):
    miss = _missing(t, (a, b), 'final_acc')
    if miss:
      return None, miss
    per_seed, lower, total = {}, 0, 0
    for seed, pairs in _paired_rounds(t.find(a), t.find(b), 'test_acc', from_round).items():
      d = [x - y for x, y in pairs]
      per_seed[seed] = float(np.mean(d))
      lower += sum(x < 0 for x in d)
      total += len(d)
    g = results.stat(per_seed)
    if g['mean'] is None:
      return None, f'no shared rounds from round {from_round}'
    detail = (f'rounds {from_round}-last ({_name(a)} lower in {lower} of {total} (seed, '
              f'round) pairs): mean per-seed gap {_name(a)} - {_name(b)} ')
    return _equivalent(g, tol, detail)
  return implementation(fn)


def same_values(ref: Ref, key_a: str, key_b: str, tol: float = 1e-3) -> Callable:
  """Two statistics of one row agree in every seed within ``tol`` (e.g. a personalised
  accuracy that is its global model's): a setting check, no test."""
  def fn(t: Table):
    miss = _missing(t, (ref,), key_a) or _missing(t, (ref,), key_b)
    if miss:
      return None, miss
    sa, sb = t.stat(ref, key_a), t.stat(ref, key_b)
    seeds = sorted(set(sa['values']) & set(sb['values']))
    worst = max((abs(sa['values'][s] - sb['values'][s]) for s in seeds), default=0.0)
    detail = (f'{_name(ref)}: {key_a} {_fmt(sa)} vs {key_b} {_fmt(sb)}; largest per-seed '
              f'difference {worst:.4f} over {len(seeds)} seeds; tolerance {tol:g}')
    if len(seeds) < MIN_PAIRED_SEEDS:
      return None, detail + f'; fewer than {MIN_PAIRED_SEEDS} seeds'
    return bool(worst <= tol), detail
  return implementation(fn)


def same_metric(a: Ref, b: Ref, metric: str, tol: float = 1e-3) -> Callable:
  """A per-round metric that depends only on the shared draws (SCARLET's hit ratio) is the
  same in ``a`` and ``b``: every round both logged, every seed both ran, within ``tol``."""
  def fn(t: Table):
    miss = _missing(t, (a, b), 'final_acc')
    if miss:
      return None, miss
    paired = _paired_rounds(t.find(a), t.find(b), metric)
    seeds, count = len(paired), sum(len(p) for p in paired.values())
    worst = max((abs(x - y) for p in paired.values() for x, y in p), default=0.0)
    if not count:
      return None, f'{metric} not logged by both'
    detail = (f'{metric}: largest difference {worst:.4f} over {count} (seed, round) pairs of '
              f'{seeds} seeds; tolerance {tol:g}')
    if seeds < MIN_PAIRED_SEEDS:
      return None, detail + f'; fewer than {MIN_PAIRED_SEEDS} paired seeds'
    return bool(worst <= tol), detail
  return implementation(fn)


def within_draw_noise(a: Ref, b: Ref, noise_a: Ref, noise_b: Ref, at_round: int) -> Callable:
  """The paired gap ``a - b`` at ``at_round`` is no larger than the gap random draws alone
  make: two runs of one implementation that differ only in their random draws
  (``noise_a - noise_b``, per seed).

  Holds when ``|mean(a - b)| <= rms(noise_a - noise_b)`` (the typical size of a per-seed
  difference that the draws make by themselves); None when a run is missing.
  """
  def fn(t: Table):
    miss = _missing(t, (a, b, noise_a, noise_b), 'final_acc')
    if miss:
      return None, miss

    def diff(x: Ref, y: Ref) -> dict[str, Any]:
      return paired(*(results.stat(values_at_round(t.find(r), 'test_acc', at_round))
                      for r in (x, y)))

    d, n = diff(a, b), diff(noise_a, noise_b)
    if d['mean'] is None or not n['values']:
      return None, f'not logged at round {at_round}'
    rms = float(np.sqrt(np.mean(np.square(list(n['values'].values())))))
    detail = (f'round {at_round}: {_name(a)} - {_name(b)} {fmt_delta(d)} (n={d["n"]}); '
              f'{_name(noise_a)} - {_name(noise_b)} {fmt_delta(n)} (n={n["n"]}), rms '
              f'{rms:.3f}')
    return abs(d['mean']) <= rms, detail
  return implementation(fn)


def pair_checks(sweep_name: str, ours: Ref, ref: Ref,
                 rounds: Sequence[int | None], steady: bool = True) -> list[Check]:
  """fedjax_kd's ``ours`` against the reference's ``ref``, paired by seed, equivalent within
  2 points (:func:`equivalence`) at each of ``rounds`` (None: the last round), and
  (``steady``) over the whole shared curve."""
  checks = [Check(f"fedjax_kd's {_name(ours)} accuracy equals the reference's at "
                  f'{"round " + str(r) if r else "the last round"} (paired by seed, '
                  'equivalent within 2 points)', sweep_name, matches(ours, ref, at_round=r))
            for r in rounds]
  if steady:
    checks.append(Check(
        f"fedjax_kd's {_name(ours)} neither trails nor leads the reference steadily (per-seed "
        'mean gap over the shared rounds from round 2, equivalent within 2 points)',
        sweep_name, no_steady_gap(ours, ref, tol=0.02)))
  return checks
