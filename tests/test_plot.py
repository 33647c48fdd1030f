"""The figures of fedjax_kd.plot, on hand-written workdirs and one real run."""

import json
import os

import numpy as np
import pytest

from fedjax_kd import plot
from fedjax_kd.running import workdir as workdir_lib

PNG = b'\x89PNG\r\n\x1a\n'

# Round 2 is not evaluated (None), round 4 has no test_acc at all.
METRICS = [
    {'round': 1, 'participants': 3, 'cum_bytes': 150_000, 'cum_up_bytes': 50_000,
     'cum_down_bytes': 100_000, 'test_acc': 0.25},
    {'round': 2, 'participants': 3, 'cum_bytes': 1_200_000, 'cum_up_bytes': 400_000,
     'cum_down_bytes': 800_000, 'test_acc': None},
    {'round': 3, 'participants': 3, 'cum_bytes': 30_000_000, 'cum_up_bytes': 10_000_000,
     'cum_down_bytes': 20_000_000, 'test_acc': 0.5},
    {'round': 4, 'participants': 3, 'cum_bytes': 45_000_000, 'cum_up_bytes': 15_000_000,
     'cum_down_bytes': 30_000_000},
    {'round': 5, 'participants': 3, 'cum_bytes': 2_000_000_000, 'cum_up_bytes': 1e9,
     'cum_down_bytes': 1e9, 'test_acc': 0.875},
]
TRAIN_COUNTS = [[5, 0, 7, 1], [0, 9, 2, 3], [4, 4, 0, 8]]
CLIENTS = {'round': 5, 'split': 'server test set', 'acc': [0.5, None, 0.75],
           'loss': [1.0, None, 0.5], 'test_n': None, 'train_n': [13, 14, 16],
           'client_models': ['cnn@0.5', 'cnn@1.0', 'cnn@1.0']}


def write_run(path, metrics=METRICS, algorithm='dsfl', partition=True, clients=True,
              torn=False, summary=None):
  """A workdir written by hand; returns its path as a string.

  ``summary``: fields added to (or, None values, removed from) ``summary.json``;
  ``summary=False`` writes none.
  """
  os.makedirs(path, exist_ok=True)
  text = ''.join(json.dumps(r) + '\n' for r in metrics)
  if torn:
    text += '{"round": 99, "test_acc": 0.'   # a write cut short: no newline
  (path / 'metrics.jsonl').write_text(text)
  (path / 'config.json').write_text(json.dumps(
      {'algorithm': algorithm, 'rounds': len(metrics),
       'data': {'source': 'digits', 'partition': 'dirichlet', 'alpha': 0.1},
       'clients': {'num_clients': 3}}))
  if summary is not False:
    doc = {'algorithm': algorithm, 'final_acc': 0.875, 'top_acc': 0.875,
           'cum_bytes': metrics[-1]['cum_bytes'], **(summary or {})}
    (path / 'summary.json').write_text(json.dumps(
        {k: v for k, v in doc.items() if v is not None}))
  if partition:
    (path / 'partition.json').write_text(json.dumps(
        {'num_clients': 3, 'num_classes': 4, 'train_counts': TRAIN_COUNTS,
         'test_counts': None, 'client_models': CLIENTS['client_models']}))
  if clients:
    (path / 'clients.json').write_text(json.dumps(CLIENTS))
  return str(path)


def expected_series():
  rows = [r for r in METRICS if r.get('test_acc') is not None]
  return ([r['round'] for r in rows], [r['cum_bytes'] / 1e6 for r in rows],
          [r['test_acc'] for r in rows])


def legend_texts(ax):
  return [t.get_text() for t in ax.get_legend().get_texts()]


def is_png(path):
  with open(path, 'rb') as f:
    data = f.read()
  return data[:8] == PNG and len(data) > 5000


def test_accuracy_vs_bytes_is_log_mb_and_skips_unevaluated_rows(tmp_path):
  runs = [workdir_lib.read_run(write_run(tmp_path / 'a')),
          workdir_lib.read_run(write_run(tmp_path / 'b', metrics=METRICS[:3]))]
  fig = plot.figure_accuracy_vs_bytes(runs, ['first', 'second'])
  ax, = [a for a in fig.axes]
  assert ax.get_xscale() == 'log'
  assert 'MB' in ax.get_xlabel() and 'log' in ax.get_xlabel()
  assert '%' not in ax.get_ylabel() and 'accuracy' in ax.get_ylabel()   # a fraction, as in tables
  assert legend_texts(ax) == ['first (server test acc)', 'second (server test acc)']
  _, mb, pct = expected_series()
  line, line2 = ax.get_lines()
  np.testing.assert_allclose(line.get_xdata(), mb)        # [0.15, 30, 2000]
  np.testing.assert_allclose(line.get_ydata(), pct)       # [25, 50, 87.5]
  np.testing.assert_allclose(line2.get_xdata(), mb[:2])
  assert line.get_color() != line2.get_color()


def test_accuracy_vs_round_line_equals_metrics(tmp_path):
  run = workdir_lib.read_run(write_run(tmp_path / 'a'))
  fig = plot.figure_accuracy_vs_round([run], ['only'])
  ax = fig.axes[0]
  rounds, _, pct = expected_series()
  line, = ax.get_lines()
  np.testing.assert_array_equal(line.get_xdata(), rounds)  # [1, 3, 5]
  np.testing.assert_allclose(line.get_ydata(), pct)
  assert ax.get_xlabel() == 'round' and ax.get_ylabel() == 'server test accuracy'
  assert legend_texts(ax) == ['only (server test acc)']


def test_run_colors_are_consistent_across_figures(tmp_path):
  runs = [workdir_lib.read_run(write_run(tmp_path / n)) for n in 'abc']
  by_round = plot.figure_accuracy_vs_round(runs, list('abc')).axes[0].get_lines()
  by_bytes = plot.figure_accuracy_vs_bytes(runs, list('abc')).axes[0].get_lines()
  assert [l.get_color() for l in by_round] == [l.get_color() for l in by_bytes]
  assert len({l.get_color() for l in by_round}) == 3


def test_no_two_of_forty_curves_look_alike():
  looks = [plot.run_style(i) for i in range(40)]
  assert len(set(looks)) == 40
  assert looks[0] == (plot.run_color(0), '-') and looks[10][1] == '--'


def test_partition_heatmap_equals_train_counts(tmp_path):
  run = workdir_lib.read_run(write_run(tmp_path / 'a'))
  fig = plot.figure_partition(run, 'a (dsfl)')
  ax = fig.axes[0]
  image, = ax.get_images()
  np.testing.assert_array_equal(np.asarray(image.get_array()), TRAIN_COUNTS)
  assert ax.get_xlabel() == 'class' and ax.get_ylabel() == 'client'
  assert 'a (dsfl)' in ax.get_title() and 'dirichlet α=0.1' in ax.get_title()
  assert any(a.get_ylabel() == 'samples' for a in fig.axes)      # the colorbar
  # Small: every cell carries its count; the side panel has the totals.
  assert sorted(int(t.get_text()) for t in ax.texts) == sorted(np.ravel(TRAIN_COUNTS))
  bars = [p.get_width() for p in fig.axes[1].patches]
  np.testing.assert_array_equal(bars, np.sum(TRAIN_COUNTS, axis=1))


def test_partition_heatmap_of_many_clients_has_no_cell_text(tmp_path):
  counts = np.random.default_rng(0).integers(0, 50, size=(120, 10))
  run = {'partition': {'num_clients': 120, 'num_classes': 10, 'train_counts': counts.tolist(),
                       'test_counts': None, 'client_models': ['cnn'] * 120},
         'config': None}
  ax = plot.figure_partition(run, 'big').axes[0]
  assert not ax.texts
  np.testing.assert_array_equal(np.asarray(ax.get_images()[0].get_array()), counts)


def test_figures_return_none_without_their_files(tmp_path):
  run = workdir_lib.read_run(write_run(tmp_path / 'a', partition=False, clients=False))
  assert plot.figure_partition(run, 'a') is None
  assert plot.figure_client_accuracy([run], ['a']) is None


def test_client_figure_ignores_none_and_colors_by_model(tmp_path):
  with_clients = workdir_lib.read_run(write_run(tmp_path / 'a'))
  without = workdir_lib.read_run(write_run(tmp_path / 'b', clients=False))
  fig = plot.figure_client_accuracy([with_clients, without], ['a', 'b'])
  ax = fig.axes[0]
  points = [c for c in ax.collections if (c.get_gid() or '').startswith('clients:')]
  values = sorted(y for c in points for y in c.get_offsets()[:, 1])
  assert values == [0.5, 0.75]                     # the None client is left out
  assert {c.get_gid() for c in points} == {'clients:a:cnn@0.5', 'clients:a:cnn@1.0'}
  assert legend_texts(ax) == ['cnn@0.5', 'cnn@1.0']
  assert '%' not in ax.get_ylabel() and 'accuracy' in ax.get_ylabel()   # a fraction, as in tables
  assert 'round 5' in ax.get_title() and 'server test set' in ax.get_title()
  assert [t.get_text() for t in ax.get_xticklabels()] == ['a\n2 clients']   # b has no clients


def test_plot_runs_writes_pngs_with_documented_names(tmp_path):
  a = write_run(tmp_path / 'x' / 'run', algorithm='dsfl')
  b = write_run(tmp_path / 'y' / 'run', algorithm='fedmd')   # same basename
  out = tmp_path / 'plots'
  files = plot.plot_runs([a, b], str(out))
  names = {'accuracy_vs_round', 'accuracy_vs_bytes', 'client_accuracy',
           'partition_x-run-dsfl', 'partition_y-run-fedmd'}
  assert set(files) == names | {'partition'}
  assert files['partition'] == files['partition_x-run-dsfl']
  for key in names:
    assert files[key] == str(out / f'{key}.png')
    assert is_png(files[key]), key
  assert plot.default_labels([a, b], [workdir_lib.read_run(a), workdir_lib.read_run(b)]) == [
      'x/run (dsfl)', 'y/run (fedmd)']


def test_plot_runs_single_run_names(tmp_path):
  files = plot.plot_runs([write_run(tmp_path / 'dsfl_era')], str(tmp_path / 'o'))
  assert set(files) == {'accuracy_vs_round', 'accuracy_vs_bytes', 'client_accuracy',
                        'partition'}
  assert os.path.basename(files['partition']) == 'partition.png'
  assert all(is_png(p) for p in files.values())


def test_main_writes_into_out_and_uses_labels(tmp_path, capsys):
  a, b = write_run(tmp_path / 'a'), write_run(tmp_path / 'b')
  out = tmp_path / 'figs'
  assert plot.main([a, b, '--out', str(out), '--labels', 'one,two']) == 0
  assert is_png(out / 'accuracy_vs_bytes.png')
  assert is_png(out / 'partition_one.png') and is_png(out / 'partition_two.png')
  assert 'accuracy_vs_bytes' in capsys.readouterr().out


def test_main_default_out_is_dir_plots(tmp_path):
  a = write_run(tmp_path / 'a')
  assert plot.main([a]) == 0
  assert is_png(tmp_path / 'a' / 'plots' / 'accuracy_vs_round.png')


@pytest.mark.parametrize('case', ['missing', 'no_metrics', 'bad_labels', 'out_png', 'out_file'])
def test_main_errors_exit_2_with_message(tmp_path, capsys, case):
  out = str(tmp_path / 'o')
  if case in ('out_png', 'out_file'):   # --out takes a folder: a file name is refused
    args = [write_run(tmp_path / 'a')]
    out = str(tmp_path / 'cmp.png') if case == 'out_png' else str(tmp_path / 'a/metrics.jsonl')
  elif case == 'missing':
    args = [str(tmp_path / 'nope')]
  elif case == 'no_metrics':
    (tmp_path / 'empty').mkdir()
    args = [str(tmp_path / 'empty')]
  else:
    args = [write_run(tmp_path / 'a'), '--labels', 'x,y']
  assert plot.main(args + ['--out', out]) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and err.count('\n') == 1
  assert 'Traceback' not in err
  if case == 'out_png':
    assert f'--out={out} names a file; --out takes a folder' in err
    assert not os.path.exists(out)
  if case == 'no_metrics':
    assert 'metrics.jsonl' in err


def test_torn_last_line_still_plots(tmp_path):
  a = write_run(tmp_path / 'a', torn=True)
  files = plot.plot_runs([a], str(tmp_path / 'o'))
  assert is_png(files['accuracy_vs_round'])
  line, = plot.figure_accuracy_vs_round([workdir_lib.read_run(a)], ['a']).axes[0].get_lines()
  np.testing.assert_array_equal(line.get_xdata(), [1, 3, 5])   # round 99 is not there


def test_client_acc_metric_and_its_fallback(tmp_path):
  server = [dict(r, client_acc=(None if r.get('test_acc') is None else r['test_acc'] / 2))
            for r in METRICS]
  a = write_run(tmp_path / 'a', metrics=server)        # DS-FL-like: server and clients
  b = write_run(tmp_path / 'b', algorithm='fedcache2')  # UA is test_acc, no client_acc
  runs = [workdir_lib.read_run(a), workdir_lib.read_run(b)]
  fig = plot.figure_accuracy_vs_bytes(runs, ['a', 'b'], metric='client_acc')
  la, lb = fig.axes[0].get_lines()
  _, _, acc = expected_series()
  np.testing.assert_allclose(la.get_ydata(), np.asarray(acc) / 2)
  np.testing.assert_allclose(lb.get_ydata(), acc)
  assert fig.axes[0].get_ylabel() == 'mean client accuracy'
  with pytest.raises(ValueError, match='metric'):
    plot.plot_runs([a], str(tmp_path / 'o'), metric='server_acc')
  # The real-run end of the pipeline is tested in test_reliability
  # (test_clients_and_partition_files plots a run the runner wrote).


# ------------------------------------------------ which accuracy, setup bytes, titles
def _with(rows, **fields):
  """The rows with ``fields`` added to every evaluated one (value: a function of test_acc)."""
  return [dict(r, **{k: f(r['test_acc']) for k, f in fields.items()})
          if r.get('test_acc') is not None else dict(r) for r in rows]


def test_legends_and_axis_name_the_accuracy(tmp_path):
  # DS-FL logs its server model as test_acc and the clients' mean as client_acc;
  # FedCache 2.0's test_acc is the clients' mean (it logs client_acc_min, no client_acc).
  dsfl = workdir_lib.read_run(write_run(tmp_path / 'dsfl', metrics=_with(
      METRICS, client_acc=lambda a: a / 2)))
  fc2 = workdir_lib.read_run(write_run(tmp_path / 'fc2', algorithm='fedcache2', metrics=_with(
      METRICS, client_acc_min=lambda a: a / 4)))
  assert [plot.accuracy_kind(r) for r in (dsfl, fc2)] == ['server', 'client']
  for figure in (plot.figure_accuracy_vs_round, plot.figure_accuracy_vs_bytes):
    ax = figure([dsfl, fc2], ['DS-FL', 'FedCache 2.0']).axes[0]
    assert legend_texts(ax) == ['DS-FL (server test acc)', 'FedCache 2.0 (mean client acc)']
    assert ax.get_ylabel() == 'server test or mean client accuracy'
    ax = figure([dsfl, fc2], ['DS-FL', 'FedCache 2.0'], metric='client_acc').axes[0]
    assert legend_texts(ax) == ['DS-FL (mean client acc)', 'FedCache 2.0 (mean client acc)']
    assert ax.get_ylabel() == 'mean client accuracy'
    la, lb = ax.get_lines()   # DS-FL's client_acc line, FedCache 2.0's test_acc
    np.testing.assert_allclose(la.get_ydata(), np.asarray(expected_series()[2]) / 2)
    np.testing.assert_allclose(lb.get_ydata(), expected_series()[2])
    ax = figure([fc2], ['FedCache 2.0']).axes[0]
    assert ax.get_ylabel() == 'mean client accuracy'
  # A default label's parenthesis takes the accuracy in.
  ax = plot.figure_accuracy_vs_round(
      [dsfl, fc2], plot.default_labels([dsfl['workdir'], fc2['workdir']], [dsfl, fc2])).axes[0]
  assert legend_texts(ax) == ['dsfl (dsfl, server test acc)', 'fc2 (fedcache2, mean client acc)']
  # Rows that do not tell (no client columns): the algorithm decides.
  bare = workdir_lib.read_run(write_run(tmp_path / 'fd', algorithm='fd'))
  assert plot.accuracy_kind(bare) == 'client'
  assert plot.accuracy_kind(workdir_lib.read_run(write_run(tmp_path / 'x'))) == 'server'


SETUP = 2_000_000          # the one-time open-set download
PER_ROUND = 50_000         # every round sends this much
SETUP_METRICS = [
    {'round': t, 'round_bytes': PER_ROUND, 'cum_bytes': SETUP + t * PER_ROUND,
     'test_acc': acc}
    for t, acc in [(1, 0.25), (2, None), (3, 0.5), (4, 0.75)]]


@pytest.mark.parametrize('source', ['summary', 'metrics'])
def test_exclude_setup_bytes_shifts_x_by_the_setup(tmp_path, source):
  if source == 'summary':   # a finished run: summary.json says it; rows lack round_bytes
    rows = [{k: v for k, v in r.items() if k != 'round_bytes'} for r in SETUP_METRICS]
    path = write_run(tmp_path / 'a', metrics=rows, summary={'setup_bytes': SETUP})
  else:                     # a run still going: round 1's cum_bytes - round_bytes
    path = write_run(tmp_path / 'a', metrics=SETUP_METRICS, summary=False)
  run = workdir_lib.read_run(path)
  assert plot.setup_bytes(run) == SETUP

  ax = plot.figure_accuracy_vs_bytes([run], ['DS-FL']).axes[0]
  line, = ax.get_lines()
  np.testing.assert_allclose(line.get_xdata(), [2.05, 2.15, 2.2])   # MB, setup included
  assert 'including the one-time setup of 2 MB' in ax.get_xlabel()

  ax = plot.figure_accuracy_vs_bytes([run], ['DS-FL'], exclude_setup_bytes=True).axes[0]
  line, = ax.get_lines()
  # Round 1: 2,050,000 cumulative bytes - 2,000,000 setup = 50,000 B = 0.05 MB.
  assert line.get_xdata()[0] == pytest.approx((2_050_000 - 2_000_000) / 1e6)
  np.testing.assert_allclose(line.get_xdata(), [0.05, 0.15, 0.2])
  np.testing.assert_allclose(line.get_ydata(), [0.25, 0.5, 0.75])
  label = ax.get_xlabel().replace('\n', ' ')
  assert 'excluding the one-time setup of 2 MB' in label and 'log scale' in label


def test_exclude_setup_bytes_on_the_command_line(tmp_path, capsys):
  a = write_run(tmp_path / 'a', metrics=SETUP_METRICS)
  assert plot.main([a, '--out', str(tmp_path / 'o'), '--exclude_setup_bytes']) == 0
  assert is_png(tmp_path / 'o' / 'accuracy_vs_bytes.png')
  files = plot.plot_runs([a], str(tmp_path / 'p'), exclude_setup_bytes=True)
  assert is_png(files['accuracy_vs_bytes'])
  # A run that records no setup bytes (no summary setup_bytes, no round_bytes) is refused.
  b = write_run(tmp_path / 'b')
  capsys.readouterr()
  assert plot.main([b, '--out', str(tmp_path / 'q'), '--exclude_setup_bytes']) == 2
  err = capsys.readouterr().err
  assert err.startswith('error: ') and 'setup' in err and 'Traceback' not in err
  assert plot.main([b, '--out', str(tmp_path / 'q')]) == 0   # without the flag: fine


def _inside_figure(fig, text):
  """Whether a drawn Text lies within the figure, in pixels."""
  box = text.get_window_extent(fig.canvas.get_renderer())
  return box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0 and box.y1 <= fig.bbox.height


def test_long_titles_wrap_within_the_figure(tmp_path):
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  long_label = ('DS-FL with entropy reduction aggregation at temperature 0.1, SCARLET-style '
                'cache duration 5 and power sharpening beta 2 (seed 0)')
  a = write_run(tmp_path / 'a')
  with open(os.path.join(a, 'config.json')) as f:
    config = json.load(f)
  config['data'].update(source='npz:/content/drive/MyDrive/datasets/mnist_keras_layout.npz',
                        partition='client_dirichlet', alpha=0.05)
  with open(os.path.join(a, 'config.json'), 'w') as f:
    json.dump(config, f)
  run = workdir_lib.read_run(a)
  other = dict(workdir_lib.read_run(write_run(tmp_path / 'b')),
               clients=dict(CLIENTS, round=3, split='per-client test splits'))
  figs = [plot.figure_partition(run, long_label),
          plot.figure_client_accuracy([run, other], [long_label, 'b'])]
  for fig in figs:
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    title = fig.axes[0].title
    assert '\n' in title.get_text(), title.get_text()
    assert _inside_figure(fig, title), title.get_text()
    # Nothing lost: the words are all there, only the spaces became line breaks.
    assert long_label.split()[-1] in title.get_text()
  # The bytes figure's x label, long when it names the setup, stays inside too.
  fig = plot.figure_accuracy_vs_bytes(
      [workdir_lib.read_run(write_run(tmp_path / 'c', metrics=SETUP_METRICS))] * 8,
      list('abcdefgh'), exclude_setup_bytes=True)
  FigureCanvasAgg(fig)
  fig.canvas.draw()
  assert _inside_figure(fig, fig.axes[0].xaxis.label)
  assert _inside_figure(fig, fig.axes[0].title)


def test_a_sweep_figure_gives_each_curve_its_own_look_and_its_seeds():
  from fedjax_kd.sweep import report
  series = lambda: {'test_acc': {'round': np.array([1, 2]), 'acc': np.array([0.2, 0.4]),
                                 'cum_bytes': np.array([1e6, 2e6])}}
  cells = [{'variant': v, 'label': f'{v} ({c})', 'cell_label': c, 'headline': 'server',
            'curves': {s: series() for s in range(n)}}
           for v in ('FedAvg', 'FedProx') for c, n in (('uniform', 5), ('fedentopt', 4),
                                                       ('power_of_choice', 5))]
  fig = report.figure_accuracy(cells, 'test_acc', title='t')
  lines = fig.axes[0].get_lines()
  looks = [(l.get_color(), l.get_linestyle()) for l in lines]
  assert len(set(looks)) == 6                              # no two curves alike
  assert len({l.get_color() for l in lines[:3]}) == 1      # a colour per method ...
  assert [l.get_linestyle() for l in lines[:3]] == ['-', '--', ':']   # ... a style per rule
  assert [l.get_label().endswith(f'(n={n})') for l, n in zip(lines, (5, 4, 5) * 2)] == [True] * 6
  assert 'n = 4-5 seeds' in fig.axes[0].get_title()
  assert all(t == int(t) for t in fig.axes[0].get_xticks())   # whole rounds
