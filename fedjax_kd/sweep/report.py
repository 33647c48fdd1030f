"""A sweep's outputs: ``compare.md``, ``compare.csv`` and the accuracy figures.

Part of :mod:`fedjax_kd.sweep`.
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import os
from typing import Any, Sequence

import numpy as np

from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep.collect import BASE_STATS, METRIC_NAMES
from fedjax_kd.sweep.planning import PLAN_FILE, read_json, show_value
from fedjax_kd.sweep.workers import diverged_lines

def _columns(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]
             ) -> list[tuple[str, str, str]]:
  cols = [c for c in BASE_STATS
          if any(cell['stats'].get(c[0], {}).get('n') for cell in cells)
          or c[0] in ('final_acc', 'best_acc')]
  for x in thresholds:
    cols.append((f'rounds_to_{x:g}', f'rounds to {x:g}', 'num'))
    cols.append((f'bytes_to_{x:g}', f'MB to {x:g}', 'bytes'))
  metrics = []
  for cell in cells:
    metrics += [m for m in cell.get('metrics', []) if m not in metrics]
  cols += [(m, f'mean {m}', 'num4') for m in metrics]
  return cols


def format_column(cell: dict[str, Any], key: str, kind: str) -> str:
  """A cell's statistic as table text; ``rounds_to_<x>`` adds ``(k/n)``; kind ``'num4'``
  (extra metrics) gives 3 decimals, none from 1000 up."""
  s = cell['stats'].get(key)
  if kind == 'num4':
    if not s or s.get('mean') is None:
      return '–'
    digits = 0 if abs(s['mean']) >= 1000 else 3
    std = '–' if s.get('std') is None else f'{s["std"]:.{digits}f}'
    return f'{s["mean"]:.{digits}f} ± {std}'
  text = results.fmt_stat(s, kind)
  if key.startswith('rounds_to_'):
    k, n = cell['reached'][key[len('rounds_to_'):]]
    text = f'{text} ({k}/{n})' if k else f'– (0/{n})'
  return text


def markdown_table(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> str:
  """The cells as a markdown table (mean ± std over seeds; n = finished seeds)."""
  fields: list[str] = []
  for c in cells:
    fields += [f for f in c['cell'] if f not in fields]
  cols = _columns(cells, thresholds)
  head = ['variant'] + fields + ['n'] + [h for _, h, _ in cols]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for c in cells:
    n = f'{c["n"]}' if c['n'] == c['planned'] else f'{c["n"]} of {c["planned"]}'
    vals = [c['variant']] + [show_value(c['cell'][f]) if f in c['cell'] else '' for f in fields]
    vals += [n] + [format_column(c, k, kind) for k, _, kind in cols]
    lines.append('| ' + ' | '.join(v.replace('|', '\\|') for v in vals) + ' |')
  return '\n'.join(lines)


def csv_text(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> str:
  """The cells as CSV: ``<stat>_mean`` and ``<stat>_std`` columns (std 0 when n = 1).

  Also ``n``, ``planned`` and ``reached_<x>`` (``'k/n'``); grid fields get a
  column each.
  """
  fields: list[str] = []
  for c in cells:
    fields += [f for f in c['cell'] if f not in fields]
  cols = _columns(cells, thresholds)
  header = ['variant', 'algorithm'] + fields + ['n', 'planned']
  for k, _, _ in cols:
    header += [f'{k}_mean', f'{k}_std']
  header += [f'reached_{x:g}' for x in thresholds]
  buf = io.StringIO()
  w = csv.writer(buf, lineterminator='\n')
  w.writerow(header)
  for c in cells:
    row = [c['variant'], c['algorithm']] + [show_value(c['cell'][f]) if f in c['cell'] else ''
                                            for f in fields] + [c['n'], c['planned']]
    for k, _, _ in cols:
      s = c['stats'].get(k) or {}
      mean = s.get('mean')
      row += ['' if mean is None else repr(mean),
              '' if mean is None else repr(s['std'] if s.get('std') is not None else 0.0)]
    row += ['{}/{}'.format(*c['reached'][f'{x:g}']) for x in thresholds]
    w.writerow(row)
  return buf.getvalue()


# ------------------------------------------------------------ figures
def seed_band(curves: Sequence[dict[str, np.ndarray]]) -> tuple[np.ndarray, ...]:
  """Rounds, mean cum bytes, mean and std of accuracy over the seeds logging each round."""
  rounds = sorted(set(int(r) for s in curves for r in s['round']))
  acc = np.full((len(curves), len(rounds)), np.nan)
  byt = np.full_like(acc, np.nan)
  pos = {r: j for j, r in enumerate(rounds)}
  for i, s in enumerate(curves):
    for r, a, b in zip(s['round'], s['acc'], s['cum_bytes']):
      acc[i, pos[int(r)]] = a
      byt[i, pos[int(r)]] = b
  with np.errstate(all='ignore'), _no_warnings():
    mean = np.nanmean(acc, axis=0)
    n = np.sum(np.isfinite(acc), axis=0)
    std = np.where(n > 1, np.nanstd(acc, axis=0, ddof=1), 0.0)
    b = np.nanmean(byt, axis=0)
  return np.array(rounds), b, mean, np.nan_to_num(std)


class _no_warnings:
  def __enter__(self):
    import warnings  # pylint: disable=g-import-not-at-top
    self._ctx = warnings.catch_warnings()
    self._ctx.__enter__()
    warnings.simplefilter('ignore', RuntimeWarning)

  def __exit__(self, *exc):
    return self._ctx.__exit__(*exc)


def legend_label(cell: dict[str, Any], metric: str) -> str:
  """``'DS-FL ERA — server test acc'``: the cell and what its curve is."""
  if metric == 'client_acc':
    what = 'mean client acc'
  else:
    what = 'mean client test acc' if cell.get('headline') == 'client' else 'server test acc'
  return f'{cell["label"]} — {what}'


def figure_accuracy(cells: Sequence[dict[str, Any]], metric: str = 'test_acc',
                    title: str = '') -> Any:
  """Mean accuracy (a fraction, as in the tables) with a ±std band over seeds, against the
  round and the bytes.

  Args:
    cells: from :func:`aggregate`.
    metric: ``'test_acc'`` or ``'client_acc'`` (:func:`series`).
    title: the figure's title (default: the metric's name).

  Returns:
    A :class:`matplotlib.figure.Figure` (not registered with pyplot) with two
    axes: accuracy vs round and vs cumulative communication (MB, log scale;
    cells that send nothing cannot stand on it and are named in a note on that
    axis); only the first when no cell
    logs bytes (e.g. a reference implementation that counts none); None when
    no cell has the metric.
  """
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  from fedjax_kd.plot import LINE_STYLES, run_color, run_style  # pylint: disable=g-import-not-at-top
  drawn = []
  for i, c in enumerate(cells):
    curves = [cv[metric] for cv in c['curves'].values() if len(cv[metric]['round'])]
    if curves:
      drawn.append((i, c, seed_band(curves)))
  if not drawn:
    return None
  many = len(drawn) > 6
  any_bytes = any(np.any(np.isfinite(b) & (b > 0)) for _, _, (_, b, _, _) in drawn)
  fig = Figure(figsize=((13.0 if any_bytes else 7.0) + (3.0 if many else 0.0), 4.8),
               layout='constrained')
  ax_r, ax_b = fig.subplots(1, 2) if any_bytes else (fig.subplots(1, 1), None)
  silent = []   # cells that send nothing: no place on a log axis, so named on it
  name = METRIC_NAMES[metric]
  seeds = []
  # A distinct colour and line style per curve: with a grid of at most four cells, a colour
  # per variant and a line style per cell (FedAvg solid/dashed/dotted by selection rule);
  # otherwise the colours in turn, then the next line style.
  variants = list(dict.fromkeys(c['variant'] for _, c, _ in drawn))
  grid = list(dict.fromkeys(c.get('cell_label', '') for _, c, _ in drawn))
  by_cell = 1 < len(grid) <= len(LINE_STYLES)
  for k, (_, c, (rounds, b, mean, std)) in enumerate(drawn):
    color, style = ((run_color(variants.index(c['variant'])),
                     LINE_STYLES[grid.index(c.get('cell_label', ''))]) if by_cell
                    else run_style(k))
    n = sum(1 for cv in c['curves'].values() if len(cv[metric]['round']))
    seeds.append(n)
    label = f'{legend_label(c, metric)} (n={n})'
    marker = 'o' if len(rounds) <= 30 else None
    ax_r.plot(rounds, mean, style, color=color, label=label, marker=marker, markersize=3,
              linewidth=1.5)
    lo, hi = np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1)
    ax_r.fill_between(rounds, lo, hi, color=color, alpha=0.2,
                      linewidth=0)
    keep = np.isfinite(b) & (b > 0)
    if keep.any():
      ax_b.plot(b[keep] / results.MB, mean[keep], style, color=color, label=label,
                marker=marker, markersize=3, linewidth=1.5)
      ax_b.fill_between(b[keep] / results.MB, lo[keep], hi[keep],
                        color=color, alpha=0.2, linewidth=0)
    elif np.all(b[np.isfinite(b)] == 0):
      silent.append(c['label'])
  ax_r.set_xlabel('round')
  ax_r.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for ax in (ax_r, ax_b) if any_bytes else (ax_r,):
    ax.set_ylabel(f'{name}, mean ± std over seeds')
    ax.grid(True, alpha=0.35)
  if any_bytes:
    ax_b.set_xscale('log')
    lo, hi = ax_b.get_xlim()
    span = hi / lo if lo > 0 else math.inf
    labelled = set(range(2, 10)) if span < 10 else {2, 5} if span < 100 else set()

    def minor(v, _):
      lead = int(round(v / 10 ** math.floor(math.log10(v) + 1e-9))) if v > 0 else 0
      return f'{v:g}' if lead in labelled else ''

    ax_b.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax_b.xaxis.set_minor_formatter(ticker.FuncFormatter(minor))
    ax_b.set_xlabel('cumulative communication (MB, log scale)')
    ax_b.set_title(f'{title or name} vs communication', fontsize='medium')
    if silent:
      ax_b.text(0.01, 0.01, 'not on the log axis (0 bytes): ' + ', '.join(silent),
                transform=ax_b.transAxes, fontsize='small', va='bottom', ha='left', wrap=True,
                gid='zero-bytes')
  n_text = (f'n = {seeds[0]} seeds' if min(seeds) == max(seeds)
            else f'n = {min(seeds)}-{max(seeds)} seeds')
  ax_r.set_title(f'{title or name} vs round ({n_text})', fontsize='medium')
  handles, labels = ax_r.get_legend_handles_labels()
  if many:
    fig.legend(handles, labels, loc='outside right upper', fontsize='small', frameon=False)
  else:
    ax_r.legend(loc='best', fontsize='small', framealpha=0.85)
  return fig


def write_figures(prefix: str, cells: Sequence[dict[str, Any]], title: str = '') -> dict[str, str]:
  """``<prefix>test_acc.png`` and, where any cell has client accuracy, ``<prefix>client_acc.png``.

  Returns:
    ``{metric: path}`` of the files written; ``{}`` without matplotlib (the ``plot`` extra).
  """
  out = {}
  if importlib.util.find_spec('matplotlib') is None:
    return out
  for metric in ('test_acc', 'client_acc'):
    if metric == 'client_acc' and not any(
        results.finite(r) for c in cells for cv in c['curves'].values()
        for r in cv['client_acc']['acc']):
      continue
    fig = figure_accuracy(cells, metric, title)
    if fig is not None:
      out[metric] = save_figure(fig, f'{prefix}{metric}.png')
  return out


def save_figure(fig: Any, path: str) -> str:
  """Saves ``fig`` as :func:`fedjax_kd.running.results.save_figure` does, but atomically.

  The PNG is rendered in memory, then written to a temporary file that replaces ``path``,
  so a full disk (or a kill) leaves the old figure or none, never a truncated one.

  Returns:
    ``path``.

  Raises:
    DiskFullError: the device is full (the message names ``path`` and the free space).
  """
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(fig)
  buf = io.BytesIO()
  fig.savefig(buf, format='png', dpi=results.DPI)
  plt.close(fig)   # a no-op for figures pyplot does not manage
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  workdir_lib.write_bytes(path, buf.getvalue())
  return path


def write_outputs(out_dir: str, cells: Sequence[dict[str, Any]],
                  thresholds: Sequence[float] | None = None, title: str = '') -> dict[str, str]:
  """Writes ``compare.csv``, ``compare.md`` and the accuracy figures into ``out_dir``.

  Args:
    out_dir: the sweep's directory.
    cells: from :func:`aggregate`.
    thresholds: the rounds/bytes-to-threshold columns (default: the cells').
    title: a heading for ``compare.md`` and the figures.

  Returns:
    ``{'csv', 'md', 'test_acc'[, 'client_acc']}``: the paths written.

  Raises:
    DiskFullError: a file could not be written for lack of space; every file is written
      atomically, so each is either as it was or complete.
  """
  if thresholds is None:
    thresholds = cells[0]['thresholds'] if cells else ()
  thresholds = tuple(float(x) for x in thresholds)
  os.makedirs(out_dir, exist_ok=True)
  paths = {'csv': os.path.join(out_dir, 'compare.csv'),
           'md': os.path.join(out_dir, 'compare.md')}
  workdir_lib.write_text(paths['csv'], csv_text(cells, thresholds))
  plan_doc = read_json(os.path.join(out_dir, PLAN_FILE)) or {}
  lines = [f'# {title or "Sweep"}', '']
  if plan_doc.get('config'):
    lines.append(f'Config: `{plan_doc["config"]}`' + (
        f'; overrides: `{_overrides_text(plan_doc.get("overrides"))}`'
        if plan_doc.get('overrides') else ''))
  seeds = sorted({s for c in cells for s in c['seeds'] + c['incomplete']})
  lines += [f'Seeds: {", ".join(map(str, seeds))}. Values are mean ± sample std over the '
            'finished seeds (n); "–" = undefined (one seed) or never reached. acc = the '
            "algorithm's test_acc (server model; mean client model for FD, single, FedCache "
            '2.0, ACE-pFL); client acc = mean client-model accuracy; rounds/MB to x: first '
            'evaluated round with acc >= x, over the seeds that reached it (k/n).', '',
            markdown_table(cells, thresholds), '']
  diverged = diverged_lines(cells)
  if diverged:
    lines += ['Diverged (a round left NaN or Inf; not in n): ' + '; '.join(diverged) + '.', '']
  figs = write_figures(os.path.join(out_dir, 'accuracy_'), cells, title)
  for metric, path in figs.items():
    lines.append(f'![{metric}]({os.path.basename(path)})')
  if not figs and importlib.util.find_spec('matplotlib') is None:
    lines.append("(No figures: matplotlib is not installed; pip install 'fedjax_kd[plot]'.)")
  paths.update(figs)
  workdir_lib.write_text(paths['md'], '\n'.join(lines).rstrip() + '\n')
  return paths


def _overrides_text(overrides: Any) -> str:
  if isinstance(overrides, dict):
    return ' '.join(f'{k}={show_value(v)}' for k, v in overrides.items())
  return str(overrides)
