"""A run's results: reading its rows, summarising them, showing them.

One module for everything that reads or shows what runs wrote, so that the runner's summary,
the sweep's tables, the plots and the reproduction report agree on every rule:

* reading rows: :func:`finite`, :func:`headline` (which accuracy a run's ``test_acc`` is: the
  server model's or the clients' mean), :func:`series` (one metric's evaluated rounds);
* summarising: :func:`summarize` (``summary.json``), :func:`convergence`, :func:`stat` (mean and
  sample std over seeds);
* comparing runs: :func:`metric_kind`, :func:`same_metric`, :func:`differing` (whether two runs
  give the same numbers, each column to its kind's tolerance);
* showing: :func:`fmt_bytes`, :func:`fmt_time`, :func:`fmt_stat`, :func:`header_line`,
  :func:`summary_table`, :func:`slug` (file and folder names), :func:`save_figure`.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Mapping, Sequence

import numpy as np

from fedjax_kd.metric_names import SCORED_MODEL
from fedjax_kd.ops import comm

MB = 1e6
DPI = 130     # every figure the project writes


# ---------------------------------------------------------------- reading rows
def finite(v: Any) -> bool:
  """Whether ``v`` is a finite number (bools and None are not)."""
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def has_server_model(algorithm: Any) -> bool:
  """Whether the registered algorithm scores a server model (unknown names: True)."""
  from fedjax_kd import algorithms  # pylint: disable=g-import-not-at-top  (jax: only here)
  cls = algorithms.ALGORITHMS.get(algorithm) if isinstance(algorithm, str) else None
  return True if cls is None else bool(cls.has_server_model)


def headline(rows: Sequence[dict[str, Any]], algorithm: str | None = None) -> str:
  """Which accuracy ``test_acc`` is in these rows: ``'server'`` or ``'client'``.

  The server (global) model's where the rows also log ``client_acc`` (DS-FL, SCARLET,
  FedAvg, ... evaluate both); the mean of the client models where they log
  ``client_acc_min`` without ``client_acc`` (FD, single, FedCache 2.0, ACE-pFL); else by the
  algorithm (the clients' mean where its class has no server model; an unknown or missing
  algorithm counts as one with a server model).
  """
  if any(finite(r.get('client_acc')) for r in rows):
    return 'server'
  if any('client_acc_min' in r for r in rows):
    return 'client'
  return 'server' if has_server_model(algorithm) else 'client'


def series(rows: Sequence[dict[str, Any]], metric: str,
           algorithm: str | None = None) -> dict[str, np.ndarray]:
  """A run's logged rounds of one metric as arrays (``'test_acc'``, ``'client_acc'``, ...).

  ``'client_acc'`` is ``test_acc`` itself where that is the mean client accuracy
  (:func:`headline`); rows without a finite value (rounds that were not evaluated,
  ``eval.every > 1``) are left out.

  Returns:
    ``{'round', 'acc', 'cum_bytes'}`` (empty arrays when nothing was logged); ``cum_bytes``
    is NaN where a row lacks it.
  """
  key = metric
  if metric == 'client_acc' and not any(finite(r.get('client_acc')) for r in rows):
    key = 'test_acc' if headline(rows, algorithm) == 'client' else None
  keep = [r for r in rows if key and finite(r.get(key))]
  return {'round': np.array([r['round'] for r in keep], np.int64),
          'acc': np.array([r[key] for r in keep], np.float64),
          'cum_bytes': np.array([r['cum_bytes'] if finite(r.get('cum_bytes')) else np.nan
                                 for r in keep], np.float64)}


def final_model_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
  """The rows that scored the same model as the last evaluated row (every row when the run
  logs no :data:`SCORED_MODEL`)."""
  marked = [r for r in rows if r.get(SCORED_MODEL) is not None]
  if not marked:
    return list(rows)
  last = marked[-1][SCORED_MODEL]
  return [r for r in rows if r.get(SCORED_MODEL) == last]


# ---------------------------------------------------------------- summarising
def summarize(rows: Sequence[dict[str, Any]], spec: Any, setup_bytes: Mapping[str, int],
              rules_name: str) -> dict[str, Any]:
  """``summary.json``'s accuracy, byte and convergence fields of a run's rows.

  Args:
    rows: the run's ``metrics.jsonl`` rows, in round order.
    spec: its :class:`fedjax_kd.config.spec.ExperimentSpec` (algorithm, ComU thresholds).
    setup_bytes: the one-time exchange before round 1 (``{'up', 'down', 'total'}``).
    rules_name: the byte-accounting rules in use.
  """
  evaluated = [r for r in final_model_rows(rows) if r.get('test_acc') is not None]
  accs = [r['test_acc'] for r in evaluated]
  top = int(np.argmax(accs)) if accs else None
  out = {
      'algorithm': spec.algorithm, 'rounds': rows[-1]['round'] if rows else 0,
      'final_acc': accs[-1] if accs else None,
      'top_acc': accs[top] if accs else None,
      'top_round': evaluated[top]['round'] if accs else None,
      # FD and single report the mean client accuracy as test_acc.
      'final_client_acc': (evaluated[-1].get('client_acc', evaluated[-1]['test_acc'])
                           if evaluated else None),
      'cum_bytes': rows[-1]['cum_bytes'] if rows else setup_bytes['total'],
      'cum_up_bytes': rows[-1]['cum_up_bytes'] if rows else setup_bytes['up'],
      'cum_down_bytes': rows[-1]['cum_down_bytes'] if rows else setup_bytes['down'],
      'setup_bytes': setup_bytes['total'], 'comm_rules': rules_name,
  }
  cum = [r['cum_bytes'] for r in evaluated]
  for x in spec.comm.thresholds:
    out[f'comu@{x:g}'] = comm.comu_at(accs, cum, x)
  out.update(convergence(rows))
  return out


def convergence(rows: Sequence[dict[str, Any]], patience: int = 20,
                min_delta: float = 0.001) -> dict[str, Any]:
  """Round, accuracy, bytes and time "to convergence" r* (ACE-pFL's time and GB figures).

  r* is the last round whose accuracy beat the best so far by more than
  ``min_delta`` (0.1 points), provided ``patience`` rounds followed without
  such a gain; otherwise the run has not converged and r* is its last round.
  The criterion is the per-client validation accuracy where a run logs one
  (``val_acc``), else ``test_acc``.
  """
  key = 'val_acc' if any(r.get('val_acc') is not None for r in rows) else 'test_acc'
  seq = [r for r in rows if r.get(key) is not None]
  if not seq:
    return {}
  best, at = -np.inf, 0
  for i, r in enumerate(seq):
    if r[key] > best + min_delta:
      best, at = r[key], i
  if seq[-1]['round'] - seq[at]['round'] < patience:
    at = len(seq) - 1
  r_star = seq[at]['round']
  upto = [r for r in rows if r['round'] <= r_star]
  tested = [r for r in upto if r.get('test_acc') is not None]
  return {'converged_round': r_star, 'converged_by': key,
          'converged_acc': tested[-1]['test_acc'] if tested else None,
          'converged_bytes': upto[-1]['cum_bytes'],
          'converged_time_s': float(sum(r.get('round_time_s') or 0.0 for r in upto))}


def stat(values: Mapping[int, float]) -> dict[str, Any]:
  """Mean and sample standard deviation (ddof=1) of per-seed values.

  Args:
    values: ``{seed: value}``; non-finite and None values are left out.

  Returns:
    ``{'mean', 'std', 'n', 'values'}``; ``std`` is None with fewer than two
    values, ``mean`` is None with none.
  """
  vals = {int(k): float(v) for k, v in values.items() if finite(v)}
  x = np.array(list(vals.values()), np.float64)
  return {'mean': float(x.mean()) if len(x) else None,
          'std': float(x.std(ddof=1)) if len(x) > 1 else None,
          'n': len(x), 'values': vals}


# ---------------------------------------------------------------- comparing runs
FLOAT_FLOOR = 0.1   # a float below this (a loss near zero) is compared as if it were this


def metric_kind(column: str, value: Any) -> str:
  """How a metric column is compared: ``'exact'`` (integers: rounds, bytes, counts,
  selections, partitions; strings and lists), ``'accuracy'`` (a fraction of samples) or
  ``'float'`` (losses, entropies, distances, temperatures, ratios; relative)."""
  if isinstance(value, (bool, int, str, list, dict)):
    return 'exact'
  return 'accuracy' if 'acc' in column else 'float'


def _missing(v: Any) -> bool:
  return v is None or (isinstance(v, float) and math.isnan(v))


def same_metric(column: str, got: Any, want: Any, *, accuracy_tol: float,
                rel_tol: float) -> bool:
  """Whether ``got`` is the recorded ``want`` of one metric column.

  Integers must be equal and of the same type; a missing value (None, which is how the
  metrics file writes NaN) only equals a missing one; accuracies may differ by
  ``accuracy_tol``, other floats by ``rel_tol`` relative to at least :data:`FLOAT_FLOOR`.
  """
  k = metric_kind(column, want)
  if k == 'exact':
    return got == want and isinstance(got, type(want))
  if _missing(got) or _missing(want):
    return _missing(got) and _missing(want)
  if k == 'accuracy':
    return abs(got - want) <= accuracy_tol
  return abs(got - want) <= rel_tol * max(abs(want), FLOAT_FLOOR)


def differing(got: Mapping[str, Any], want: Mapping[str, Any], *, accuracy_tol: float,
              rel_tol: float) -> dict[str, tuple[Any, Any]]:
  """``{column: (got, want)}`` for each column of the recorded row ``want`` that ``got``
  does not give (:func:`same_metric`); timings (``*_s``) are left out."""
  return {k: (got.get(k), w) for k, w in want.items()
          if not k.endswith('_s') and not same_metric(k, got.get(k), w,
                                                      accuracy_tol=accuracy_tol,
                                                      rel_tol=rel_tol)}


# ---------------------------------------------------------------- showing
def fmt_bytes(b: float) -> str:
  """``1234567`` -> ``'1.23 MB'``."""
  for unit, scale in (('GB', 1e9), ('MB', 1e6), ('kB', 1e3)):
    if b >= scale:
      return f'{b / scale:.2f} {unit}'
  return f'{int(b)} B'


def fmt_time(s: float) -> str:
  """Seconds as ``'5s'``, ``'1m08s'`` or ``'2h03m04s'``."""
  m, s = divmod(int(round(s)), 60)
  h, m = divmod(m, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else (f'{m}m{s:02d}s' if m else f'{s}s')


def fmt_stat(s: dict[str, Any] | None, kind: str = 'acc') -> str:
  """``'0.600 ± 0.100'``; ``'0.600 ± –'`` for one seed; ``'–'`` for none.

  Args:
    s: a :func:`stat` dict.
    kind: ``'acc'`` (3 decimals), ``'bytes'`` (MB, 2 decimals), ``'kbytes'``
      (kB, 1 decimal) or ``'num'`` (1 decimal).
  """
  if not s or s.get('mean') is None:
    return '–'
  scale, digits = {'acc': (1.0, 3), 'bytes': (MB, 2), 'kbytes': (1e3, 1),
                   'num': (1.0, 1)}[kind]
  std = '–' if s.get('std') is None else f'{s["std"] / scale:.{digits}f}'
  return f'{s["mean"] / scale:.{digits}f} ± {std}'


def header_line(spec: Any, exp: Any, env: dict[str, Any], memory: str = '') -> str:
  """What runs, in one line: algorithm, clients, data, models, device (and ``memory``, the
  device memory it plans for, ``'about 539 MiB, all clients at once'``, when given)."""
  d = exp.ctx.data
  share = f'{spec.clients.participation:.0%} a round' if spec.clients.participation < 1 else 'all every round'
  models = ', '.join(dict.fromkeys(spec.clients.models))
  server = f' | server {spec.server.model}' if exp.algorithm.server_model is not None else ''
  dev = env['device']
  return (f'fedjax_kd {env["versions"]["fedjax_kd"]} | {spec.algorithm} | {spec.clients.num_clients} '
          f'clients ({share}) | data {spec.data.source}: {int(np.sum(d.client_n)):,} private, '
          f'{int(d.x_public.shape[0]):,} public, {int(d.x_test.shape[0]):,} test | clients '
          f'{models}{server} | seed {spec.seed} | {dev["platform"]} x{dev["count"]}'
          + (f' | memory {memory}' if memory else ''))


def summary_table(summary: dict[str, Any], workdir: str) -> str:
  """The short table a run ends with."""
  def acc(x):
    return '-' if x is None else f'{x:.4f}'

  final_round = summary.get('rounds')
  server = has_server_model(summary.get('algorithm'))
  what = 'server model' if server else 'mean over clients'
  lines = [
      ('algorithm', summary.get('algorithm')),
      ('final acc', f'{acc(summary.get("final_acc"))} ({what}, round {final_round})'),
      ('best acc', f'{acc(summary.get("top_acc"))} (round {summary.get("top_round")})'),
  ]
  if server and summary.get('final_client_acc') is not None:
    lines.append(('client acc', f'{acc(summary.get("final_client_acc"))} (mean over clients, '
                                f'round {final_round})'))
  lines += [
      ('rounds', f'{final_round} ({summary.get("rounds_run_this_call", 0)} in this call)'),
      ('bytes up', fmt_bytes(summary.get('cum_up_bytes', 0))),
      ('bytes down', fmt_bytes(summary.get('cum_down_bytes', 0))),
      ('bytes total', f'{fmt_bytes(summary.get("cum_bytes", 0))} '
                      f'(setup {fmt_bytes(summary.get("setup_bytes", 0))})'),
      ('wall time', fmt_time(summary.get('wall_time_s', 0.0))),
      ('workdir', workdir),
  ]
  if summary.get('stopped_by'):
    lines.insert(1, ('stopped by', f'{summary["stopped_by"]} (rerun to resume)'))
  width = max(len(k) for k, _ in lines)
  rule = '-' * (width + 2 + max(len(str(v)) for _, v in lines))
  return '\n'.join([rule] + [f'{k:<{width}}  {v}' for k, v in lines] + [rule])


def slug(text: Any) -> str:
  """A lower-case, path-safe form: ``'DS-FL (ERA, T=0.1)'`` -> ``'ds-fl-era-t-0.1'``."""
  if isinstance(text, (tuple, list)):
    text = '+'.join(str(v) for v in text)
  out = re.sub(r'[^a-z0-9.]+', '-', str(text).lower()).strip('-.')
  return out or 'x'


def save_figure(fig: Any, path: str) -> str:
  """Saves ``fig`` as a PNG at :data:`DPI` with the Agg canvas (any backend is left alone),
  closes it, and returns ``path``."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(fig)
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=DPI)
  plt.close(fig)   # a no-op for figures pyplot does not manage
  return path
