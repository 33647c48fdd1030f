"""The report's tables and figures of one sweep: its table of variants (:func:`sweep_table`),
the curves by round (:func:`curve_table`, :func:`metric_curve_table`,
:func:`seed_curve_table`, :func:`paired_round_table`), the figures (:func:`copy_figures`,
:func:`pair_figure`) and the lines on its setting and machines.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.reproduction.defs import CHANCE_FACTOR, CLASSES, SweepDef
from benchmarks.reproduction.stats import Table, fmt_delta, paired, values_at_round
from fedjax_kd import sweep
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib

# Report columns: key -> (header, stat key, format kind).
COLUMNS = {
    'acc': ('final acc', 'final_acc', 'acc'),
    'best': ('best acc', 'best_acc', 'acc'),
    'last10': ('last-10 acc', 'last10_acc', 'acc'),
    'client': ('final client acc', 'final_client_acc', 'acc'),
    'bytes': ('total MB', 'total_bytes', 'bytes'),
    'bytes_round': ('kB / round', 'bytes_per_round', 'kbytes'),
    'wall': ('wall s / run', 'wall_s', 'num'),
}


def esc(text: str) -> str:
  return str(text).replace('|', '\\|')


def at_chance(d: SweepDef, cells: Sequence[dict[str, Any]]) -> list[tuple[str, int, float]]:
  """``(label, seed, last-10 accuracy)`` of each finished run of ``d`` whose last-10
  accuracy is below :data:`CHANCE_FACTOR` / C (C: the task's classes)."""
  bound = CHANCE_FACTOR / CLASSES[d.data]
  return [(c['label'], int(s), float(v)) for c in cells
          for s, v in sorted(c['stats'].get('last10_acc', {}).get('values', {}).items())
          if v < bound]


def setting_line(cells: Sequence[dict[str, Any]], out: str) -> str:
  """A line describing the runs, read from a finished run's ``config.json``."""
  plan_doc = sweep.load_plan(out)
  for e in plan_doc.get('runs', []):
    cfg = workdir_lib.read_json(os.path.join(out, e['workdir']), 'config.json')
    if cfg:
      break
  else:
    return ''
  data, clients = cfg.get('data', {}), cfg.get('clients', {})
  part = data.get('partition', '')
  if part in ('dirichlet', 'client_dirichlet', 'niid_labeldir'):
    part += f' alpha={data.get("alpha")}'
  elif part == 'shards':
    part += f' ({data.get("shards_per_client")} per client)'
  elif part == 'classes':
    part += f' ({data.get("classes_per_client")} per client)'
  source = str(data.get('source', ''))
  if source.startswith('npz:'):
    source = f'npz:{os.path.basename(source[4:])}'
  models = clients.get('models') or []
  return (f'{cfg.get("rounds")} rounds; {clients.get("num_clients")} clients '
          f'({100 * float(clients.get("participation", 1.0)):g}% a round); data `{source}`, '
          f'{part}; models {", ".join(f"`{m}`" for m in models)} (variants may differ); '
          f'public set {data.get("num_public")}; byte rules `{cfg.get("comm", {}).get("rules")}`.')


def curve_table(rounds: Sequence[int], cells: Sequence[dict[str, Any]]) -> str:
  """Each cell's headline accuracy at ``rounds`` (mean ± std over seeds; '–' where not logged)."""
  head = ['variant', 'n'] + [f'round {r}' for r in rounds]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for c in cells:
    row = [esc(c['variant'] + (f' ({sweep.cell_label(list(c["cell"].items()))})'
                                if c['cell'] else '')), str(c['n'])]
    for r in rounds:
      row.append(results.fmt_stat(results.stat(values_at_round(c, 'test_acc', r)), 'acc'))
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def metric_curve_table(variant: str, metrics: Sequence[str],
                       cells: Sequence[dict[str, Any]]) -> str:
  """One variant's per-round metrics (rows) at every logged round (mean ± std over seeds)."""
  cell = next((c for c in cells if c['label'] == variant), None)
  if cell is None or not cell['curves']:
    return f'*{variant}: no finished run.*'
  rounds = sorted({int(r) for cv in cell['curves'].values() for m in metrics
                   for r in cv[m]['round']})
  head = ['metric'] + [str(r) for r in rounds]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for m in metrics:
    row = [m]
    for r in rounds:
      st = results.stat(values_at_round(cell, m, r))
      row.append('–' if st.get('mean') is None else f'{st["mean"]:.2f}' + (
          f' ± {st["std"]:.2f}' if st.get('std') is not None else ''))
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def seed_curve_table(labels: Sequence[str], cells: Sequence[dict[str, Any]],
                     by_seed: bool = False) -> str:
  """Every evaluated round's headline accuracy, one row per (variant, seed).

  Rows go variant by variant, or with ``by_seed`` seed by seed (the variants of one seed
  next to each other, in ``labels`` order: for comparing implementations on the same seed).
  """
  rows = [(c, seed, cv['test_acc']) for c in cells if c['variant'] in labels
          for seed, cv in sorted(c['curves'].items())]
  if by_seed:
    rows.sort(key=lambda row: (row[1], list(labels).index(row[0]['variant'])))
  rounds = sorted({int(r) for _, _, s in rows for r in s['round']})
  head = ['variant', 'seed'] + [str(r) for r in rounds]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for c, seed, s in rows:
    by_round = dict(zip((int(r) for r in s['round']), s['acc']))
    lines.append('| ' + ' | '.join(
        [esc(c['variant']), str(seed)]
        + [f'{by_round[r]:.3f}' if r in by_round else '–' for r in rounds]) + ' |')
  return '\n'.join(lines)


def sweep_table(d: SweepDef, cells: Sequence[dict[str, Any]]) -> str:
  """The report table of one sweep."""
  headers = dict(d.headers)
  fields: list[str] = []
  for c in cells:
    fields += [f for f in c['cell'] if f not in fields]
  thresholds = cells[0]['thresholds'] if cells else []
  cols: list[tuple[str, Callable[[dict[str, Any]], str]]] = []
  ref = Table(cells).find(d.reference) if d.reference else None
  for key in d.columns:
    if key in COLUMNS:
      head, stat_key, kind = COLUMNS[key]
      cols.append((headers.get(key, head),
                   lambda c, k=stat_key, kind=kind: results.fmt_stat(c['stats'].get(k), kind)))
    elif key == 'rounds_to':
      for x in thresholds:
        cols.append((f'rounds to {x:g} (k/n)',
                     lambda c, x=x: sweep.format_column(c, f'rounds_to_{x:g}', 'num')))
    elif key == 'bytes_to':
      for x in thresholds:
        cols.append((f'MB to {x:g}', lambda c, x=x: results.fmt_stat(
            c['stats'].get(f'bytes_to_{x:g}'), 'bytes') + ' ({}/{})'.format(
                *c['reached'][f'{x:g}'])))
    elif key == 'delta':
      def delta(c, ref=ref):
        if ref is None or c is ref:
          return '–' if ref is None else '(reference)'
        a, b = c['stats']['final_acc'], ref['stats']['final_acc']
        if a['mean'] is None or b['mean'] is None:
          return '–'
        return fmt_delta(paired(a, b))
      cols.append((headers.get('delta', f'Δ final acc vs {d.reference}'), delta))
    elif key.startswith('metric:'):
      m = key[len('metric:'):]
      cols.append((f'mean {m}', lambda c, m=m: sweep.format_column(c, m, 'num4')))
    else:
      raise ValueError(f'{d.name}: unknown column {key!r}')
  head = ['variant'] + fields + ['n'] + [h for h, _ in cols]
  lines = ['| ' + ' | '.join(esc(h) for h in head) + ' |', '|' + '---|' * len(head)]
  for c in cells:
    n = str(c['n']) if c['n'] == c['planned'] else f'{c["n"]} of {c["planned"]}'
    row = [c['variant']] + [sweep.show_value(c['cell'][f]) if f in c['cell'] else ''
                            for f in fields] + [n] + [fn(c) for _, fn in cols]
    lines.append('| ' + ' | '.join(esc(v) for v in row) + ' |')
  return '\n'.join(lines)


def copy_figures(out: str, prefix: str, cells: Sequence[dict[str, Any]],
             title: str) -> dict[str, str]:
  """The sweep's accuracy figures at ``<prefix><metric>.png``: copied from its outputs
  (``run`` writes them with the tables), drawn from ``cells`` where missing."""
  made = {}
  for metric in ('test_acc', 'client_acc'):
    src = os.path.join(out, f'accuracy_{metric}.png')
    if os.path.exists(src):
      os.makedirs(os.path.dirname(prefix) or '.', exist_ok=True)
      made[metric] = shutil.copyfile(src, f'{prefix}{metric}.png')
  return made or sweep.write_figures(prefix, cells, title=title)


def _cell_name(c: dict[str, Any]) -> str:
  return c['variant'] + (f' ({sweep.cell_label(list(c["cell"].items()))})' if c['cell'] else '')


def paired_round_table(ref: str, rounds: Sequence[int], cells: Sequence[dict[str, Any]]) -> str:
  """Per-seed differences of each other cell's accuracy from ``ref``'s (the same grid cell,
  the same seed) at ``rounds``: mean ± std over the seeds both logged (n)."""
  head = ['variant'] + [f'round {r}' for r in rounds]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  base = {tuple(sorted(c['cell'].items())): c for c in cells if c['variant'] == ref}
  for c in cells:
    b = base.get(tuple(sorted(c['cell'].items())))
    if c['variant'] == ref or b is None:
      continue
    row = [esc(_cell_name(c))]
    for r in rounds:
      d = paired(*(results.stat(values_at_round(x, 'test_acc', r)) for x in (c, b)))
      row.append('–' if d['mean'] is None else f'{fmt_delta(d)} (n={d["n"]})')
    lines.append('| ' + ' | '.join(row) + ' |')
  return '\n'.join(lines)


def pair_figure(path: str, cells: Sequence[dict[str, Any]], pairs: Sequence[tuple[str, str]],
                title: str) -> str | None:
  """One panel per ``(fedjax_kd, reference)`` pair: both implementations' test accuracy by
  round on the same axes (mean ± std band over seeds; one colour per grid cell, fedjax_kd
  solid, the reference dashed), over the grid cells, rounds and seeds the reference ran.
  None without matplotlib or without any curve."""
  if importlib.util.find_spec('matplotlib') is None:
    return None
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  from fedjax_kd.plot import run_color  # pylint: disable=g-import-not-at-top
  panels = [(a, b, [c for c in cells if c['variant'] in (a, b) and c['n']]) for a, b in pairs]
  panels = [p for p in panels if {c['variant'] for c in p[2]} == {p[0], p[1]}]
  if not panels:
    return None
  cols = min(len(panels), 2)
  rows = -(-len(panels) // cols)
  fig = Figure(figsize=(6.5 * cols, 4.2 * rows), layout='constrained')
  axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
  for ax, (a, b, group) in zip(axes, panels):
    ran = {tuple(sorted(c['cell'].items())) for c in group if c['variant'] == b}
    group = [c for c in group if tuple(sorted(c['cell'].items())) in ran]
    keys = list(dict.fromkeys(tuple(sorted(c['cell'].items())) for c in group))
    last = max((max(cv['test_acc']['round']) for c in group if c['variant'] == b
                for cv in c['curves'].values() if len(cv['test_acc']['round'])), default=0)
    both = set.intersection(*(set(c['curves']) for c in group))   # paired seeds only
    for c in group:
      curves = [cv['test_acc'] for seed, cv in c['curves'].items()
                if seed in both and len(cv['test_acc']['round'])]
      if not curves:
        continue
      rounds, _, mean, std = sweep.report.seed_band(curves)
      # One colour per grid cell; without a grid, one per implementation.
      color = run_color(keys.index(tuple(sorted(c['cell'].items()))) if len(keys) > 1
                        else int(c['variant'] != a))
      style = '-' if c['variant'] == a else '--'
      ax.plot(rounds, mean, style, color=color, linewidth=1.5,
              label=f'{_cell_name(c)} (n={len(curves)})')
      ax.fill_between(rounds, np.clip(mean - std, 0, 1), np.clip(mean + std, 0, 1),
                      color=color, alpha=0.15, linewidth=0)
    ax.set_title(f'{a} vs {b} (n = {len(both)} paired seeds)', fontsize='medium')
    if last:
      ax.set_xlim(0.5, last + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel('round')
    ax.set_ylabel('test accuracy, mean ± std over seeds')
    ax.grid(True, alpha=0.35)
    ax.legend(loc='lower right', fontsize='small', framealpha=0.85)
  for ax in axes[len(panels):]:
    fig.delaxes(ax)
  fig.suptitle(title, fontsize='medium')
  return results.save_figure(fig, path)


def machines_line(out: str, plan_doc: dict[str, Any]) -> str:
  """Which machine made which finished run, when not all on CPUs ('' when they were).

  A run's ``summary.json`` records its device (``platform``, ``kind``); runs made before it
  did are counted as not recorded. Accuracy and bytes compare across machines (float rounding
  aside); wall times do not.
  """
  by_kind: dict[str, list[str]] = {}
  for entry in plan_doc.get('runs', []):
    summary = workdir_lib.read_json(os.path.join(out, entry['workdir']), 'summary.json')
    if not isinstance(summary, dict):
      continue
    device = summary.get('device') or {}
    platform = device.get('platform')
    kind = ('not recorded' if platform is None else 'CPU' if platform == 'cpu'
            else f'{device.get("kind") or platform} ({platform.upper()})')
    by_kind.setdefault(kind, []).append(f'{entry["variant"]} seed {entry["seed"]}')
  if not any(k not in ('CPU', 'not recorded') for k in by_kind):
    return ''
  parts = [f'{kind}: ' + (f'{len(runs)} run{"s" * (len(runs) != 1)}'
                          if kind in ('CPU', 'not recorded') else ', '.join(runs))
           for kind, runs in sorted(by_kind.items())]
  return ('*Machines: ' + '; '.join(parts) + ". A seed fixes the data, partition, initial "
          "weights and batches on every machine; only the arithmetic differs (a GPU's float32 "
          'convolutions and matrix products run at TF32 precision by default), as it differs '
          'between two CPUs by rounding; bytes do not depend on it. The wall column mixes the '
          'machines.*')
