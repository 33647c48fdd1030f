r"""Figures of one or more finished (or running) workdirs.

  python -m fedjax_kd.plot DIR [DIR ...] [--out OUT_DIR] [--labels a,b,...]
      [--metric test_acc|client_acc] [--exclude_setup_bytes]

Each ``DIR`` is a run's ``--workdir`` (:mod:`fedjax_kd.running.workdir`); it is read
with :func:`fedjax_kd.running.workdir.read_run`, which uses

* ``metrics.jsonl``   the per-round rows (required; a torn last row is
  skipped): ``round``, ``test_acc`` on evaluated rounds, ``client_acc``
  (where the clients are evaluated beside a server model), ``cum_bytes``
  and ``round_bytes``;
* ``summary.json``    ``setup_bytes``, the one-time traffic before round 1
  (else it is round 1's ``cum_bytes - round_bytes``);
* ``config.json``     the algorithm and the partition for labels and titles;
* ``clients.json``    each client model's accuracy at the last evaluation;
* ``partition.json``  the clients x classes label counts.

The PNGs written to ``OUT_DIR`` (default ``DIR/plots`` for one ``DIR``,
``./plots`` for several) are listed in :func:`plot_runs`. Runs are overlaid
in the same color in every figure. Labels default to each directory's name
plus its algorithm, e.g. ``dsfl_era (dsfl)``; directories with the same name
are told apart by their parent's name. Every legend entry of the accuracy
figures also says which accuracy its line is (:func:`accuracy_kind`):
``dsfl_era (dsfl, server test acc)``, ``DS-FL (mean client acc)``, and the
y axis says it too.

``cum_bytes`` includes the one-time setup traffic (DS-FL's and SCARLET's
open-set download), which on short runs can dwarf the rounds' bytes and
squash the accuracy-vs-bytes curves against one end of the axis;
``--exclude_setup_bytes`` subtracts each run's setup bytes from the x axis
(the axis label then gives the amount left out).

Exit codes: 0 done; 2 a ``DIR`` is missing or is not a workdir, bad
``--labels``, or ``--exclude_setup_bytes`` for a run that records no setup
bytes.

The ``figure_*`` builders return :class:`matplotlib.figure.Figure` objects and
work with any backend (notebooks keep their inline backend); only
:func:`main` selects ``Agg``. The figures are not registered with pyplot, so a
notebook cell ending in one shows it once and nothing piles up in pyplot's
figure list; call ``fig.savefig(...)``, or display it in a notebook.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import textwrap
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib import ticker
from matplotlib.figure import Figure

from fedjax_kd.errors import DataError
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib

MB = results.MB
# Cells annotated with their count in the partition heatmap up to this size.
ANNOTATE_MAX_CLIENTS = 20
ANNOTATE_MAX_CLASSES = 10
# Run labels under the client-accuracy boxes are broken into lines of this many characters.
TICK_CHARS = 24


# ------------------------------------------------------------ helpers
def run_color(i: int) -> Any:
  """The color of the ``i``-th run, the same in every figure."""
  cycle = plt.rcParams['axes.prop_cycle'].by_key().get('color') or ['C0']
  return cycle[i % len(cycle)]


LINE_STYLES = ('-', '--', ':', '-.')


def run_style(i: int) -> tuple[Any, str]:
  """The ``(color, line style)`` of the ``i``-th curve: the colours cycle first, then the line
  style changes, so no two of the first 40 curves of a figure look alike."""
  cycle = plt.rcParams['axes.prop_cycle'].by_key().get('color') or ['C0']
  return cycle[i % len(cycle)], LINE_STYLES[(i // len(cycle)) % len(LINE_STYLES)]


def _model_colors(specs: Sequence[str]) -> dict[str, Any]:
  """A color per model spec, from a palette distinct from the default cycle."""
  cmap = plt.get_cmap('Dark2')
  return {s: cmap(i % cmap.N) for i, s in enumerate(specs)}


METRICS = {
    # Each algorithm's headline accuracy: the server model where there is one
    # (DS-FL, SCARLET, FedAvg), else the mean client accuracy (UA).
    'test_acc': 'test accuracy',
    # The mean accuracy of the client models (UA) for every algorithm.
    'client_acc': 'mean client accuracy',
}
# What a plotted accuracy is, by :func:`accuracy_kind`: (legend text, axis text).
KINDS = {
    'server': ('server test acc', 'server test accuracy'),
    'client': ('mean client acc', 'mean client accuracy'),
}
# Algorithms whose ``test_acc`` is the mean of the client models (their evaluated
# models are the clients: fedjax_kd.algorithms.base.Algorithm.evaluate). Only
# consulted for rows that do not tell (no ``client_acc`` / ``client_acc_min``).


def accuracy_kind(run: dict[str, Any], metric: str = 'test_acc') -> str:
  """Which accuracy a run's ``metric`` curve is: ``'server'`` or ``'client'``.

  ``'client_acc'`` is always the mean client accuracy. ``'test_acc'`` is the
  server (global) model's where the rows also log ``client_acc`` (DS-FL,
  SCARLET, FedAvg, ... evaluate both), the mean client accuracy where they log
  ``client_acc_min`` without ``client_acc`` (FD, single, FedCache 2.0,
  ACE-pFL), else by the config's algorithm: the clients' mean where its class has no
  server model (``Algorithm.has_server_model``).

  Args:
    run: a :func:`fedjax_kd.running.workdir.read_run` dict.
    metric: a key of :data:`METRICS`.

  Returns:
    A key of :data:`KINDS`.
  """
  if metric == 'client_acc':
    return 'client'
  return results.headline(run.get('metrics') or [], _algorithm(run))


def _algorithm(run: dict[str, Any]) -> str | None:
  return ((run.get('config') or {}).get('algorithm')
          or (run.get('summary') or {}).get('algorithm'))


def legend_label(label: str, kind: str) -> str:
  """``'DS-FL'`` -> ``'DS-FL (server test acc)'``; ``'x (dsfl)'`` -> ``'x (dsfl, server test acc)'``."""
  what = KINDS[kind][0]
  if label.endswith(')') and '(' in label:
    return f'{label[:-1]}, {what})'
  return f'{label} ({what})'


def _accuracy_name(kinds: Sequence[str]) -> str:
  """The y axis's accuracy: one kind's name, or both where runs differ."""
  kinds = list(dict.fromkeys(kinds))
  if len(kinds) == 1:
    return KINDS[kinds[0]][1]
  return 'server test or mean client accuracy'


def setup_bytes(run: dict[str, Any]) -> float | None:
  """A run's one-time setup traffic before round 1, in bytes (None: not recorded).

  ``summary.json``'s ``setup_bytes`` where the run has one, else round 1's
  ``cum_bytes - round_bytes`` in ``metrics.jsonl`` (a run still going).
  """
  s = (run.get('summary') or {}).get('setup_bytes')
  if results.finite(s):
    return float(s)
  for r in run.get('metrics') or []:
    if r.get('round') == 1 and results.finite(r.get('cum_bytes')) and results.finite(r.get('round_bytes')):
      return float(r['cum_bytes'] - r['round_bytes'])
  return None


def _mb(b: float) -> str:
  return f'{b / MB:.3g} MB'


def _text_width_pt(text: str, prop: Any) -> float:
  from matplotlib.textpath import TextToPath  # pylint: disable=g-import-not-at-top
  return TextToPath().get_text_width_height_descent(text, prop, ismath=False)[0]


def fit_lines(text: str, prop: Any, width_pt: float) -> str:
  """``text`` broken into lines at spaces so that each is at most ``width_pt`` wide.

  Measured with the font of ``prop`` (a :class:`matplotlib.font_manager.FontProperties`);
  a word wider than a line is broken inside. Existing line breaks are kept.
  """
  out = []
  for para in text.split('\n'):
    line = ''
    for word in para.split(' '):
      cand = f'{line} {word}' if line else word
      if not line or _text_width_pt(cand, prop) <= width_pt:
        line = cand
        if _text_width_pt(line, prop) <= width_pt:
          continue
      else:
        out.append(line)
        line = word
      while len(line) > 1 and _text_width_pt(line, prop) > width_pt:   # a word too long
        k = len(line) - 1
        while k > 1 and _text_width_pt(line[:k], prop) > width_pt:
          k -= 1
        out.append(line[:k])
        line = line[k:]
    out.append(line)
  return '\n'.join(out)


def wrap_texts(fig: Figure, margin_in: float = 0.1) -> None:
  """Breaks each axes' title and x label into lines that stay within the figure.

  Both are centered on their axes, so a line may be twice the distance from
  the axes' center to the nearer figure edge, less ``margin_in``; the axes'
  places are the figure's layout without those texts. Call it once the
  figure is complete (legends included).
  """
  texts = [(ax, t) for ax in fig.axes for t in (ax.title, ax.xaxis.label) if t.get_text()]
  if not texts:
    return
  full = [t.get_text() for _, t in texts]
  for _, t in texts:
    t.set_text('')
  fig.draw_without_rendering()   # the layout (constrained) without them: the axes' final x
  width = fig.bbox.width
  for (ax, t), text in zip(texts, full):
    cx = (ax.bbox.x0 + ax.bbox.x1) / 2 if ax.bbox.width > 0 else width / 2
    avail_px = 2 * min(cx, width - cx) - 2 * margin_in * fig.dpi
    avail_pt = max(avail_px, 0.25 * width) * 72 / fig.dpi
    t.set_text(fit_lines(text, t.get_fontproperties(), avail_pt))


def _mantissa(v: float) -> int:
  """The leading digit of a positive number: 0.05 -> 5, 300 -> 3."""
  return int(round(v / 10 ** math.floor(math.log10(v) + 1e-9)))


def _marker(n: int) -> str | None:
  """Markers on short series only (they clutter long ones)."""
  return 'o' if n <= 30 else None


def _legend(ax: Any, n: int) -> None:
  if n > 6:   # many runs: outside the axes, so no data is hidden
    ax.legend(loc='upper left', bbox_to_anchor=(1.01, 1.0), fontsize='small', frameon=False)
  else:
    ax.legend(loc='best', fontsize='small', framealpha=0.85)


def _new_figure(n_runs: int, width: float = 7.5, height: float = 4.8) -> tuple[Figure, Any]:
  # Figure() rather than plt.figure(): nothing is registered with pyplot, so
  # callers that only save the figure leak nothing; notebooks still display
  # returned figures through their rich repr.
  fig = Figure(figsize=(width + (2.5 if n_runs > 6 else 0.0), height), layout='constrained')
  return fig, fig.add_subplot()


def _accuracy_axis(ax: Any, label: str) -> None:
  """Accuracy as a fraction (0.93), the unit of every table, summary and progress line."""
  ax.set_ylabel(label)
  ax.yaxis.set_major_formatter(ticker.FormatStrFormatter('%g'))


def partition_description(config: dict[str, Any] | None) -> str | None:
  """The partition as a short phrase, e.g. ``dirichlet α=0.1``, from a config dict."""
  data = (config or {}).get('data') or {}
  name = data.get('partition')
  if not name:
    return None
  if name in ('dirichlet', 'client_dirichlet', 'niid_labeldir') and data.get('alpha') is not None:
    return f'{name} α={data["alpha"]:g}'
  if name == 'shards' and data.get('shards_per_client') is not None:
    return f'shards ({data["shards_per_client"]} per client)'
  if name == 'classes' and data.get('classes_per_client') is not None:
    return f'classes ({data["classes_per_client"]} per client)'
  return str(name)


# ------------------------------------------------------------ figures
def figure_accuracy_vs_round(runs: Sequence[dict[str, Any]], labels: Sequence[str],
                             metric: str = 'test_acc') -> Figure:
  """Test accuracy (a fraction) against the round, one line per run.

  Args:
    runs: :func:`fedjax_kd.running.workdir.read_run` dicts.
    labels: a legend label per run; the legend adds which accuracy it is
      (:func:`legend_label`), as does the y axis.
    metric: a key of :data:`METRICS`.

  Returns:
    The figure; only evaluated rounds (``test_acc`` not None) are drawn.
  """
  kinds = [accuracy_kind(run, metric) for run in runs]
  name = _accuracy_name(kinds)
  fig, ax = _new_figure(len(runs))
  for i, (run, label, kind) in enumerate(zip(runs, labels, kinds)):
    s = results.series(run['metrics'], metric, _algorithm(run))
    color, style = run_style(i)
    ax.plot(s['round'], s['acc'], style, label=legend_label(label, kind), color=color,
            marker=_marker(len(s['round'])), markersize=4, linewidth=1.6)
  ax.set_xlabel('round')
  _accuracy_axis(ax, name)
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.set_title(f'{name} vs round')
  ax.grid(True, alpha=0.35)
  _legend(ax, len(runs))
  wrap_texts(fig)
  return fig


def figure_accuracy_vs_bytes(runs: Sequence[dict[str, Any]], labels: Sequence[str],
                             metric: str = 'test_acc',
                             exclude_setup_bytes: bool = False) -> Figure:
  """Test accuracy (a fraction) against cumulative communication (MB, log scale).

  The x value of a round is its ``cum_bytes`` (uplink plus downlink, one-time
  setup traffic included) in megabytes (10^6 bytes); with
  ``exclude_setup_bytes``, ``cum_bytes`` less the run's :func:`setup_bytes`,
  and the x label names the amount left out.

  Args:
    runs: :func:`fedjax_kd.running.workdir.read_run` dicts.
    labels: a legend label per run; the legend adds which accuracy it is
      (:func:`legend_label`), as does the y axis.
    metric: a key of :data:`METRICS`.
    exclude_setup_bytes: leave each run's one-time setup traffic out of x.

  Returns:
    The figure; rows without accuracy or with no positive x are not drawn, and a run
    that sends nothing (no positive x at all) keeps its legend entry, marked
    ``(0 bytes: not on the log axis)``.

  Raises:
    DataError: ``exclude_setup_bytes`` and a run records no setup bytes.
  """
  kinds = [accuracy_kind(run, metric) for run in runs]
  name = _accuracy_name(kinds)
  setups = [setup_bytes(run) for run in runs]
  if exclude_setup_bytes:
    for run, s in zip(runs, setups):
      if s is None:
        raise DataError(f'{run.get("workdir")}: cannot exclude the setup bytes: summary.json '
                        'has no setup_bytes and metrics.jsonl no round 1 with round_bytes.')
  fig, ax = _new_figure(len(runs))
  for i, (run, label, kind) in enumerate(zip(runs, labels, kinds)):
    s = results.series(run['metrics'], metric, _algorithm(run))
    x = s['cum_bytes'] - (setups[i] if exclude_setup_bytes else 0.0)
    keep = np.isfinite(x) & (x > 0)
    entry = legend_label(label, kind) + ('' if keep.any() else ' (0 bytes: not on the log axis)')
    color, style = run_style(i)
    ax.plot(x[keep] / MB, s['acc'][keep], style, label=entry,
            color=color, marker=_marker(int(keep.sum())), markersize=4, linewidth=1.6)
  ax.set_xscale('log')
  # Plain numbers (0.1, 1, 10 ...); within a short span some minor ticks
  # are labelled too, so there are always a few labelled ticks.
  lo, hi = ax.get_xlim()
  span = hi / lo if lo > 0 else math.inf
  labelled = set(range(2, 9)) if span < 10 else {2, 5} if span < 100 else set()
  ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
  ax.xaxis.set_minor_locator(ticker.LogLocator(base=10, subs=np.arange(2, 10)))
  ax.xaxis.set_minor_formatter(ticker.FuncFormatter(
      lambda v, _: f'{v:g}' if v > 0 and _mantissa(v) in labelled else ''))
  known = sorted({s for s in setups if s is not None})
  if exclude_setup_bytes:
    amount = (f'of {_mb(known[0])}' if len(known) == 1 else
              f'of {_mb(known[0])} to {_mb(known[-1])} per run')
    xlabel = f'cumulative communication, excluding the one-time setup {amount} (MB, log scale)'
  elif known and known[-1] > 0 and None not in setups:
    amount = (_mb(known[0]) if len(known) == 1 else f'{_mb(known[0])} to {_mb(known[-1])}')
    xlabel = f'cumulative communication, including the one-time setup of {amount} (MB, log scale)'
  else:
    xlabel = 'cumulative communication (MB, log scale)'
  ax.set_xlabel(xlabel)
  _accuracy_axis(ax, name)
  ax.set_title(f'{name} vs cumulative communication'
               + (' after the one-time setup' if exclude_setup_bytes else ''))
  ax.grid(True, which='major', alpha=0.45)
  ax.grid(True, which='minor', axis='x', alpha=0.15)
  _legend(ax, len(runs))
  wrap_texts(fig)
  return fig


def figure_client_accuracy(runs: Sequence[dict[str, Any]],
                           labels: Sequence[str]) -> Figure | None:
  """Each run's per-client final test accuracy: a box plot and the clients.

  Every client is a jittered point (fixed seed) over its run's box; where a
  run's clients have different model specs the points are colored by spec,
  with a legend of the specs. Runs without ``clients.json`` are left out.

  Args:
    runs: :func:`fedjax_kd.running.workdir.read_run` dicts.
    labels: a label per run.

  Returns:
    The figure, or None if no run has ``clients.json``.
  """
  shown = [(i, run, label) for i, (run, label) in enumerate(zip(runs, labels))
           if run.get('clients')]
  if not shown:
    return None
  rng = np.random.default_rng(0)
  # Points are colored by model spec in every run as soon as one run mixes
  # specs (so a color means the same spec throughout), else by run.
  by_spec = any(len(set(run['clients'].get('client_models') or [])) > 1 for _, run, _ in shown)
  specs = sorted({m for _, run, _ in shown for m in run['clients'].get('client_models') or []
                  if m is not None}) if by_spec else []
  spec_color = _model_colors(specs)

  fig, ax = _new_figure(0, width=max(5.5, 1.7 * len(shown) + 3.0))
  ticks, when = [], []
  for pos, (i, run, label) in enumerate(shown, 1):
    c = run['clients']
    accs = c.get('acc') or []
    models = c.get('client_models') or [None] * len(accs)
    keep = [k for k, a in enumerate(accs) if results.finite(a)]
    values = np.array([accs[k] for k in keep], dtype=np.float64)
    ticks.append(f'{textwrap.fill(label, TICK_CHARS, break_on_hyphens=False)}\n'
                 f'{len(keep)} clients')
    when.append(f'round {c.get("round")}, {c.get("split")}')
    if not len(values):
      continue
    box = ax.boxplot(values, positions=[pos], widths=0.55, showfliers=False,
                     patch_artist=True, medianprops={'color': 'black', 'linewidth': 1.5})
    for patch in box['boxes']:
      patch.set_facecolor(run_color(i))
      patch.set_alpha(0.25)
      patch.set_edgecolor(run_color(i))
    x = pos + rng.uniform(-0.18, 0.18, size=len(values))
    size = 22 if len(values) <= 50 else 10
    if by_spec:
      kept_models = np.array([models[k] for k in keep], dtype=object)
      for spec in specs:
        m = kept_models == spec
        if m.any():
          ax.scatter(x[m], values[m], s=size, color=spec_color[spec], alpha=0.85,
                     edgecolors='none', zorder=3, gid=f'clients:{label}:{spec}')
    else:
      ax.scatter(x, values, s=size, color=run_color(i), alpha=0.85, edgecolors='none',
                 zorder=3, gid=f'clients:{label}')
  ax.set_xticks(range(1, len(shown) + 1), ticks)
  if len(shown) > 4:
    for t in ax.get_xticklabels():
      t.set_rotation(15)
      t.set_horizontalalignment('right')
  ax.set_xlim(0.4, len(shown) + 0.6)
  _accuracy_axis(ax, 'client test accuracy')
  ax.grid(True, axis='y', alpha=0.35)
  unique = list(dict.fromkeys(when))
  title = 'per-client test accuracy'
  if len(unique) == 1:
    title += f' ({unique[0]})'
  else:
    title += ' (' + '; '.join(f'{lab}: {w}' for (_, _, lab), w in zip(shown, when)) + ')'
  ax.set_title(title, fontsize='medium')
  if specs:
    handles = [ax.scatter([], [], s=30, color=spec_color[s], label=s) for s in specs]
    ax.legend(handles=handles, title='client model', loc='upper left',
              bbox_to_anchor=(1.01, 1.0), fontsize='small', frameon=False)
  wrap_texts(fig)
  return fig


def figure_partition(run: dict[str, Any], label: str) -> Figure | None:
  """The clients x classes training-label counts of a run as a heatmap.

  Rows are clients, columns classes, and a side panel shows each client's
  total. Cells carry their count when there are at most
  ``ANNOTATE_MAX_CLIENTS`` clients and ``ANNOTATE_MAX_CLASSES`` classes.

  Args:
    run: a :func:`fedjax_kd.running.workdir.read_run` dict.
    label: the run's label, for the title.

  Returns:
    The figure, or None if the run has no ``partition.json``.
  """
  part = run.get('partition')
  if not part or not part.get('train_counts'):
    return None
  counts = np.asarray(part['train_counts'], dtype=np.int64)
  k, c = counts.shape
  fig = Figure(figsize=(max(7.0, min(13.0, 4.0 + 0.45 * c)), max(4.0, min(9.0, 2.0 + 0.3 * k))),
               layout='constrained')
  ax, ax_tot = fig.subplots(1, 2, sharey=True, gridspec_kw={'width_ratios': [4, 1]})
  im = ax.imshow(counts, aspect='auto', cmap='viridis', interpolation='nearest')
  cbar = fig.colorbar(im, ax=[ax, ax_tot], location='right', shrink=0.9, pad=0.02)
  cbar.set_label('samples')
  ax.set_xlabel('class')
  ax.set_ylabel('client')
  if c <= 20:
    ax.set_xticks(range(c))
  else:
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  models = part.get('client_models') or []
  if k <= ANNOTATE_MAX_CLIENTS:
    ax.set_yticks(range(k))
    if len(set(models)) > 1 and len(models) == k:
      ax.set_yticklabels([f'{i} ({m})' for i, m in enumerate(models)], fontsize='small')
  else:
    ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True, nbins=12))
  if k <= ANNOTATE_MAX_CLIENTS and c <= ANNOTATE_MAX_CLASSES:
    top = counts.max() if counts.size else 0
    for (r, col), v in np.ndenumerate(counts):
      ax.text(col, r, str(v), ha='center', va='center', fontsize='x-small',
              color='black' if v > 0.6 * top else 'white')
  totals = counts.sum(axis=1)
  ax_tot.barh(np.arange(k), totals, height=0.8 if k <= 50 else 1.0, color='0.45')
  ax_tot.set_xlabel('total samples')
  ax_tot.xaxis.set_major_locator(ticker.MaxNLocator(nbins=3))
  ax_tot.tick_params(axis='y', left=False, labelleft=False)
  ax_tot.grid(True, axis='x', alpha=0.35)
  ax_tot.set_ylim(k - 0.5, -0.5)
  info = partition_description(run.get('config'))
  source = ((run.get('config') or {}).get('data') or {}).get('source')
  bits = [b for b in (source, info) if b]
  ax.set_title(f'{label}: {k} clients x {c} classes'
               + (f' ({", ".join(bits)})' if bits else ''), fontsize='medium')
  wrap_texts(fig)
  return fig


# ------------------------------------------------------------ files
def default_labels(workdirs: Sequence[str], runs: Sequence[dict[str, Any]]) -> list[str]:
  """``<dir name> (<algorithm>)``; the last two path parts where names collide.

  Args:
    workdirs: the run directories.
    runs: their :func:`fedjax_kd.running.workdir.read_run` dicts.

  Returns:
    A label per run.
  """
  parts = [os.path.normpath(os.path.abspath(w)).split(os.sep) for w in workdirs]
  names = [p[-1] for p in parts]
  if len(set(names)) < len(names):
    names = ['/'.join(p[-2:]) for p in parts]
  out = []
  for name, run in zip(names, runs):
    algo = (run.get('config') or {}).get('algorithm') or (run.get('summary') or {}).get(
        'algorithm')
    out.append(f'{name} ({algo})' if algo else name)
  return out


def plot_runs(workdirs: Sequence[str], out_dir: str,
              labels: Sequence[str] | None = None, metric: str = 'test_acc',
              exclude_setup_bytes: bool = False) -> dict[str, str]:
  """Reads the workdirs and writes every figure as a PNG in ``out_dir``.

  Files (and the keys of the returned dict):

  * ``accuracy_vs_round.png`` (``'accuracy_vs_round'``);
  * ``accuracy_vs_bytes.png`` (``'accuracy_vs_bytes'``);
  * ``client_accuracy.png`` (``'client_accuracy'``), if a run has
    ``clients.json``;
  * with one run: ``partition.png`` (``'partition'``), if it has
    ``partition.json``;
  * with several runs: ``partition_<slug>.png`` for each run that has
    ``partition.json`` (key ``'partition_<slug>'``, where ``<slug>`` is
    :func:`fedjax_kd.running.results.slug` of its label, suffixed ``_2``, ``_3``... if two labels give
    the same slug), and ``'partition'`` names the first of them.

  Args:
    workdirs: run directories.
    out_dir: where the PNGs go (created if needed).
    labels: a label per run; default :func:`default_labels`.
    metric: the accuracy of the two line figures, a key of :data:`METRICS`:
      ``'test_acc'`` (each algorithm's headline accuracy) or ``'client_acc'``
      (the mean client accuracy, UA, comparable across DS-FL, SCARLET and
      FedCache 2.0).
    exclude_setup_bytes: leave each run's one-time setup traffic out of the
      x axis of ``accuracy_vs_bytes`` (:func:`figure_accuracy_vs_bytes`).

  Returns:
    The written files by key, as above.

  Raises:
    DataError: a workdir is missing or has no ``metrics.jsonl``, or
      ``exclude_setup_bytes`` and a run records no setup bytes.
    ValueError: ``labels`` has the wrong length.
  """
  if not workdirs:
    raise ValueError('plot_runs needs at least one workdir.')
  if metric not in METRICS:
    raise ValueError(f'metric={metric!r}: expected one of {", ".join(METRICS)}.')
  for w in workdirs:
    if not os.path.isdir(w):
      raise DataError(f'{w!r} is not a directory.')
  runs = [workdir_lib.read_run(w) for w in workdirs]
  if labels is None:
    labels = default_labels(workdirs, runs)
  labels = list(labels)
  if len(labels) != len(runs):
    raise ValueError(f'{len(labels)} labels given for {len(runs)} runs.')
  os.makedirs(out_dir, exist_ok=True)

  def path(name: str) -> str:
    return os.path.join(out_dir, f'{name}.png')

  save = results.save_figure
  out = {'accuracy_vs_round': save(figure_accuracy_vs_round(runs, labels, metric),
                                   path('accuracy_vs_round')),
         'accuracy_vs_bytes': save(figure_accuracy_vs_bytes(runs, labels, metric,
                                                            exclude_setup_bytes),
                                   path('accuracy_vs_bytes'))}
  fig = figure_client_accuracy(runs, labels)
  if fig is not None:
    out['client_accuracy'] = results.save_figure(fig, path('client_accuracy'))
  used: set[str] = set()
  for run, label in zip(runs, labels):
    fig = figure_partition(run, label)
    if fig is None:
      continue
    if len(runs) == 1:
      out['partition'] = results.save_figure(fig, path('partition'))
      continue
    base = name = f'partition_{results.slug(label)}'
    n = 1
    while name in used:
      n += 1
      name = f'{base}_{n}'
    used.add(name)
    out[name] = results.save_figure(fig, path(name))
    out.setdefault('partition', out[name])
  return out


# An --out ending so is a file name a user meant for one figure: refused, naming the folder.
FIGURE_SUFFIXES = ('.png', '.pdf', '.svg', '.jpg', '.jpeg', '.eps')


def main(argv: Sequence[str] | None = None) -> int:
  """The command line (see the module docstring); returns the exit code.

  Args:
    argv: the arguments after the program name; default ``sys.argv[1:]``.

  Returns:
    0 when the figures were written, 2 for a missing or bad workdir, bad
    ``--labels`` or an ``--out`` that names a file rather than a folder (the reason goes
    to stderr as ``error: ...``).
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  parser = argparse.ArgumentParser(
      prog='python -m fedjax_kd.plot',
      description='Write PNG figures (accuracy vs round and vs communication, per-client '
                  'accuracy, label partition) of one or more fedjax_kd workdirs.')
  parser.add_argument('workdirs', nargs='+', metavar='DIR', help='a run\'s --workdir')
  parser.add_argument('--out', default=None, metavar='OUT_DIR',
                      help='output directory (default: DIR/plots for one DIR, else ./plots)')
  parser.add_argument('--labels', default=None,
                      help='comma-separated legend labels, one per DIR '
                           '(default: directory name and algorithm)')
  parser.add_argument('--metric', default='test_acc', choices=tuple(METRICS),
                      help="'test_acc': each algorithm's headline accuracy (the server "
                           "model where there is one); 'client_acc': the mean client "
                           'accuracy (UA) for every algorithm')
  parser.add_argument('--exclude_setup_bytes', action='store_true',
                      help='leave the one-time setup traffic (the open-set download) out of '
                           'the x axis of accuracy_vs_bytes, so short runs are not squashed')
  args = parser.parse_args(argv)
  out_dir = args.out or (os.path.join(args.workdirs[0], 'plots') if len(args.workdirs) == 1
                         else 'plots')
  labels = None
  if args.labels is not None:
    labels = [s.strip() for s in args.labels.split(',')]
  try:
    if os.path.isfile(out_dir) or os.path.splitext(out_dir)[1].lower() in FIGURE_SUFFIXES:
      raise ValueError(f'--out={out_dir} names a file; --out takes a folder, which receives '
                       'one PNG per figure (accuracy_vs_round.png, accuracy_vs_bytes.png, ...): '
                       f'e.g. --out={os.path.splitext(out_dir)[0]}')
    if labels is not None and len(labels) != len(args.workdirs):
      raise ValueError(f'--labels has {len(labels)} labels for {len(args.workdirs)} '
                       'directories.')
    files = plot_runs(args.workdirs, out_dir, labels, metric=args.metric,
                      exclude_setup_bytes=args.exclude_setup_bytes)
  except (DataError, ValueError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for p in dict.fromkeys(files.values()):
    print(p)
  return 0


if __name__ == '__main__':
  sys.exit(main())
