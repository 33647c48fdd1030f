"""A sweep's results gathered from its workdirs: per-run statistics, per-cell mean and std
over seeds (:func:`aggregate`).

Part of :mod:`fedjax_kd.sweep`; the rules it shares with the runner and the plots are in
:mod:`fedjax_kd.running.results`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Collection, Sequence

import numpy as np

from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep.planning import Run, cell_label, cell_slug, jsonable, load_plan, read_json
from fedjax_kd.sweep.workers import read_diverged

# Statistics of a cell, in table order: (key, column header, kind).
BASE_STATS = (
    ('final_acc', 'final acc', 'acc'),
    ('best_acc', 'best acc', 'acc'),
    ('last10_acc', 'last-10 acc', 'acc'),
    ('final_client_acc', 'final client acc', 'acc'),
    ('best_client_acc', 'best client acc', 'acc'),
    ('total_bytes', 'total MB', 'bytes'),
    ('bytes_per_round', 'kB / round', 'kbytes'),
    ('rounds', 'rounds', 'num'),
    ('wall_s', 'wall s', 'num'),
)
METRIC_NAMES = {
    'test_acc': 'test accuracy',           # the server model; the mean client model where none
    'client_acc': 'mean client accuracy',  # the mean of the client models' test accuracies
}


def run_stats(rows: Sequence[dict[str, Any]], summary: dict[str, Any] | None,
              thresholds: Sequence[float], metrics: Sequence[str] = ()) -> dict[str, Any]:
  """One run's numbers (None where the run has none).

  Args:
    rows: its ``metrics.jsonl`` rows.
    summary: its ``summary.json`` (for the wall time when rows lack
      ``round_time_s``).
    thresholds: accuracies for the rounds/bytes-to-threshold numbers (on
      ``test_acc``).
    metrics: row keys whose mean over rounds is reported.

  Returns:
    ``final_acc``, ``best_acc``, ``last10_acc`` (mean of the last 10
    evaluated ``test_acc``; these and the threshold numbers read only the rounds that scored
    the final round's model, :func:`fedjax_kd.running.results.final_model_rows`), ``final_client_acc``, ``best_client_acc``,
    ``total_bytes``, ``bytes_per_round``, ``rounds``, ``wall_s``, ``setup_bytes`` (the
    one-time bytes before round 1, included in every cumulative count),
    ``rounds_to_<x>`` and ``bytes_to_<x>`` per threshold (None if never
    reached), and each extra metric's mean.
  """
  # the rounds that scored the final model (FedConcat's classifier phase, not its clusters)
  test = results.series(results.final_model_rows(rows), 'test_acc')
  client = results.series(rows, 'client_acc')
  out: dict[str, Any] = {
      'final_acc': float(test['acc'][-1]) if len(test['acc']) else None,
      'best_acc': float(test['acc'].max()) if len(test['acc']) else None,
      'last10_acc': float(test['acc'][-10:].mean()) if len(test['acc']) else None,
      'final_client_acc': float(client['acc'][-1]) if len(client['acc']) else None,
      'best_client_acc': float(client['acc'].max()) if len(client['acc']) else None,
      'total_bytes': float(rows[-1]['cum_bytes']) if rows and results.finite(rows[-1].get('cum_bytes'))
                     else None,
      'rounds': int(rows[-1]['round']) if rows else None,
      # the one-time bytes before round 1 (e.g. DS-FL's open-data broadcast), in every
      # cumulative count above
      'setup_bytes': (float(rows[0]['cum_bytes'] - rows[0]['round_bytes'])
                      if rows and results.finite(rows[0].get('cum_bytes'))
                      and results.finite(rows[0].get('round_bytes')) else None),
  }
  per_round = [r['round_bytes'] for r in rows if results.finite(r.get('round_bytes'))]
  out['bytes_per_round'] = float(np.mean(per_round)) if per_round else None
  times = [r['round_time_s'] for r in rows if results.finite(r.get('round_time_s'))]
  out['wall_s'] = (float(sum(times)) if times else
                   (summary or {}).get('wall_time_s') if results.finite((summary or {}).get('wall_time_s'))
                   else None)
  for x in thresholds:
    hit = np.flatnonzero(test['acc'] >= x)
    out[f'rounds_to_{x:g}'] = int(test['round'][hit[0]]) if len(hit) else None
    b = test['cum_bytes'][hit[0]] if len(hit) else np.nan
    out[f'bytes_to_{x:g}'] = float(b) if np.isfinite(b) else None
  for m in metrics:
    vals = [float(r[m]) for r in rows if results.finite(r.get(m))]
    out[m] = float(np.mean(vals)) if vals else None
  return out


def is_complete(summary: dict[str, Any] | None, rounds: int | None) -> bool:
  """Whether a run's ``summary.json`` says it finished ``rounds`` rounds (None: any)."""
  if not summary or summary.get('stopped_by'):
    return False
  return rounds is None or int(summary.get('rounds') or 0) == int(rounds)


def aggregate(source: str | Sequence[Run], thresholds: Sequence[float] | None = None,
              metrics: Sequence[str] | None = None,
              exclude: Collection[str] = ()) -> list[dict[str, Any]]:
  """Mean +- std over seeds of every (variant, grid cell).

  Only finished runs count (``summary.json`` with the planned rounds and no
  ``stopped_by``); the others are listed in ``incomplete``.

  Args:
    source: a sweep's ``--out`` directory (read through its
      ``sweep.json``), or the runs of :func:`plan`.
    thresholds: accuracies for the rounds/bytes-to-threshold numbers;
      default: the plan's ``thresholds``, else the first run's
      ``comm.thresholds``.
    metrics: extra per-round metrics to average; default: the plan's.
    exclude: workdirs (as the plan names them, relative to the sweep) left out of every
      number: listed in the cell's ``excluded`` and counted in ``planned`` only (e.g. runs
      that no longer stand for today's code).

  Returns:
    One dict per cell, in plan order: ``variant``, ``algorithm``, ``cell``
    (``{field: value}``), ``cell_label``, ``label`` (variant and cell),
    ``slug``, ``planned`` (seeds planned), ``n`` (finished), ``seeds``,
    ``incomplete`` (seeds not finished), ``excluded`` (seeds left out), ``diverged`` (``{seed: round}``: runs
    stopped by a non-finite round, not counted in ``n``), ``headline`` (``'server'`` or
    ``'client'``: what ``test_acc`` is), ``thresholds``, ``metrics``,
    ``stats`` (``{key: results.stat(...)}`` for every key of :func:`run_stats`),
    ``reached`` (``{'<x>': (k, n)}``: seeds reaching each threshold) and
    ``curves`` (``{seed: {metric: series}}`` for ``'test_acc'``, ``'client_acc'``
    and each of ``metrics``).
  """
  if isinstance(source, (str, os.PathLike)):
    doc = load_plan(str(source))
    entries = [{'variant': e['variant'], 'algorithm': e.get('algorithm', ''),
                'cell': [tuple(p) for p in e.get('cell', [])], 'seed': int(e['seed']),
                'workdir': os.path.join(str(source), e['workdir']), 'rounds': e.get('rounds'),
                'name': e['workdir']}
               for e in doc.get('runs', [])]
    if thresholds is None:
      thresholds = doc.get('thresholds')
    if metrics is None:
      metrics = doc.get('metrics')
  else:
    entries = [{'variant': r.variant.label, 'algorithm': r.variant.algorithm, 'cell': list(r.cell),
                'seed': r.seed, 'workdir': r.workdir, 'rounds': r.rounds, 'name': r.workdir}
               for r in source]
    if thresholds is None and source:
      thresholds = tuple(source[0].config.comm.thresholds)
  metrics = tuple(metrics or ())
  thresholds = tuple(float(x) for x in (thresholds or ()))
  cells: dict[tuple, dict[str, Any]] = {}
  per_seed: dict[tuple, dict[int, dict[str, Any]]] = {}
  for e in entries:
    key = (e['variant'], json.dumps(e['cell'], default=jsonable))
    if key not in cells:
      cell = dict(e['cell'])
      label = e['variant'] + (f' ({cell_label(e["cell"])})' if cell else '')
      cells[key] = {'variant': e['variant'], 'algorithm': e['algorithm'], 'cell': cell,
                    'cell_label': cell_label(e['cell']), 'label': label,
                    'slug': results.slug(e['variant']) + (f'_{cell_slug(e["cell"])}' if cell else ''),
                    'planned': 0, 'seeds': [], 'incomplete': [], 'excluded': [],
                    'diverged': {},
                    'headline': None,
                    'thresholds': list(thresholds), 'metrics': list(metrics), 'curves': {}}
      per_seed[key] = {}
    c = cells[key]
    c['planned'] += 1
    wd = e['workdir']
    if e['name'] in exclude:
      c['excluded'].append(e['seed'])
      continue
    summary = read_json(os.path.join(wd, 'summary.json'))
    if not is_complete(summary, e['rounds']) or not os.path.exists(
        os.path.join(wd, workdir_lib.METRICS)):
      div = read_diverged(wd)
      if div is not None:
        c['diverged'][e['seed']] = div.get('round')
      else:
        c['incomplete'].append(e['seed'])
      continue
    rows = workdir_lib.read_metrics(wd)
    c['seeds'].append(e['seed'])
    c['headline'] = c['headline'] or results.headline(rows)
    per_seed[key][e['seed']] = run_stats(rows, summary, thresholds, metrics)
    c['curves'][e['seed']] = {m: results.series(rows, m) for m in ('test_acc', 'client_acc') + metrics}
  out = []
  for key, c in cells.items():
    runs = per_seed[key]
    keys = [k for k, _, _ in BASE_STATS] + ['setup_bytes'] + [f'{p}_{x:g}' for x in thresholds
                                            for p in ('rounds_to', 'bytes_to')] + list(metrics)
    c['stats'] = {k: results.stat({s: r.get(k) for s, r in runs.items()}) for k in keys}
    c['n'] = len(runs)
    c['reached'] = {f'{x:g}': (c['stats'][f'rounds_to_{x:g}']['n'], c['n']) for x in thresholds}
    out.append(c)
  return out
