"""The multi-seed sweep tool: planning, parsing, aggregation, the CLI, skipping and resuming."""

import csv
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from fedjax_kd import config as config_lib, sweep
from fedjax_kd.config import presets
from fedjax_kd.errors import ConfigError
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import Variant

REPO = pathlib.Path(__file__).resolve().parents[1]
# Unoptimised XLA code compiles several times faster; these runs are 2-round toys.
FAST_XLA = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'
TINY_SETS = ['rounds=2', "clients.models=('mlp@0.25',)", 'server.model=mlp@0.25',
             'clients.num_clients=4', 'train.epochs=1', 'distill.epochs=1',
             'data.source=synthetic:300', 'data.num_public=60', 'distill.public_per_round=30',
             'distill.batch_size=30',
             'log.tensorboard=False']


def sweep_env():
  env = dict(os.environ)
  env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' ' + FAST_XLA).strip()
  return env


def sigint_at_default():
  """``preexec_fn`` of a command (a run, a sweep) a test stops with SIGINT: the signal
  unblocked and at its default, whatever the test's process passes on (a shell's background
  job starts with SIGINT ignored, and an earlier test in the worker may leave it blocked; a
  child inherits either, and the signal would never arrive)."""
  signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
  signal.signal(signal.SIGINT, signal.SIG_DFL)


def _cli(*args, timeout=300):
  return subprocess.run([sys.executable, '-m', 'fedjax_kd.sweep', *args], cwd=REPO, env=sweep_env(),
                        capture_output=True, text=True, timeout=timeout)


# ------------------------------------------------------------ parsing
def test_parse_set_literals_and_grid():
  overrides, grid = sweep.parse_set([
      "clients.models=('cnn@1.0',)", 'cache.duration=0,5,10', 'data.source=npz:/tmp/m.npz',
      'comm.thresholds=(0.8,0.9)', "server.model=('a','b'),('c',)", 'train.learning_rate=1e-3',
      'data.partition="shards,x"', 'clients.shared_init=True'])
  assert overrides == {'clients.models': ('cnn@1.0',), 'data.source': 'npz:/tmp/m.npz',
                       'comm.thresholds': (0.8, 0.9), 'train.learning_rate': 1e-3,
                       'data.partition': 'shards,x', 'clients.shared_init': True}
  assert grid == {'cache.duration': [0, 5, 10], 'server.model': [('a', 'b'), ('c',)]}
  with pytest.raises(ConfigError, match='--set'):
    sweep.parse_set(['rounds'])
  with pytest.raises(ConfigError, match='twice'):
    sweep.parse_set(['rounds=2', 'rounds=3'])


def test_parse_variant_and_split():
  v = sweep.parse_variant('fixed T = T0=acepfl;acepfl.dynamic_temperature=False')
  assert (v.label, v.algorithm, dict(v.overrides)) == (
      'fixed T = T0', 'acepfl', {'acepfl.dynamic_temperature': False})
  v = sweep.parse_variant("FedAvg=fedavg;clients.models=('cnn@1.0',);dsfl.aggregation=sa")
  assert v.fields == {'algorithm': 'fedavg', 'clients.models': ('cnn@1.0',),
                      'dsfl.aggregation': 'sa'}
  assert sweep.parse_variant('fd') == Variant('fd', 'fd')
  assert sweep.split_top_level("a=('x;y',1);b=\"c;d\";e=[1,2]", ';') == [
      "a=('x;y',1)", 'b="c;d"', 'e=[1,2]']
  with pytest.raises(ConfigError):
    sweep.parse_variant('X=dsfl;novalue')


def test_load_config_with_argument():
  c = config_lib.load_file(str(REPO / 'configs/fedentopt_digits.py') + ':c2,fedprox,uniform')
  assert (c.algorithm, c.selection.method) == ('fedprox', 'uniform')
  with pytest.raises(ConfigError, match='--config'):
    config_lib.load_file(str(REPO / 'configs/nope.py'))


# ------------------------------------------------------------ planning
def test_plan_grid_slugs_and_override_order(tmp_path):
  variants = [Variant('DS-FL (ERA, T=0.1)', 'dsfl', {'train.epochs': 3}),
              Variant('SA', 'dsfl', {'dsfl.aggregation': 'sa', 'train.epochs': 2})]
  runs = sweep.plan(presets.digits(), variants, seeds=(0, 1),
                    grid={'cache.duration': [0, 5], 'train.learning_rate': [0.1, 0.05]},
                    out=str(tmp_path), overrides={'rounds': 3, 'train.epochs': 1})
  assert len(runs) == 2 * 4 * 2
  assert runs[0].name == 'ds-fl-era-t-0.1/duration-0_learning-rate-0.1/seed0'
  assert runs[1].name == 'ds-fl-era-t-0.1/duration-0_learning-rate-0.1/seed1'
  assert runs[-1].name == 'sa/duration-5_learning-rate-0.05/seed1'
  assert runs[0].workdir == os.path.join(str(tmp_path), 'runs', runs[0].name)
  assert len({r.workdir for r in runs}) == len(runs)
  last = runs[-1].config
  assert (last.seed, last.cache.duration, last.train.learning_rate) == (1, 5, 0.05)
  assert (last.dsfl.aggregation, last.rounds, last.train.epochs) == ('sa', 3, 1)  # --set wins
  assert runs[0].config.dsfl.aggregation == 'era'
  # Grid fields that end alike keep their full names; equal slugs are refused.
  assert sweep.cell_slug((('train.epochs', 1), ('distill.epochs', 2))) == (
      'train.epochs-1_distill.epochs-2')
  assert sweep.cell_slug((('clients.models', ('cnn@0.5', 'cnn@1.0')),)) == (
      'models-cnn-0.5-cnn-1.0')
  with pytest.raises(ConfigError, match='--variant'):
    sweep.plan(presets.digits(), [Variant('A b', 'dsfl'), Variant('a-B', 'fd')], (0,), {},
               str(tmp_path))


def test_plan_names_the_bad_field_and_run(tmp_path):
  with pytest.raises(ConfigError) as e:
    sweep.plan(presets.digits(), [Variant('ok', 'dsfl'), Variant('bad', 'dsfl',
                                                                 {'dsfl.aggregation': 'nope'})],
               (0,), {}, str(tmp_path))
  assert e.value.field == 'dsfl.aggregation'
  assert '[run bad/seed0]' in str(e.value)
  with pytest.raises(ConfigError, match='train.learing_rate'):
    sweep.plan(presets.digits(), [Variant('a', 'dsfl')], (0,), {}, str(tmp_path),
               {'train.learing_rate': 0.1})
  assert not os.listdir(tmp_path)   # planning writes nothing


# ------------------------------------------------------------ aggregation
def _fake_run(workdir, accs, client=None, headline_client=False, complete=True, rounds=3,
              extra=None, silent=False):
  """A workdir with known numbers: round r costs 1000 B (setup 100 B; ``silent``: nothing
  sent at all) and 1.5 s."""
  os.makedirs(workdir, exist_ok=True)
  rows = []
  for r, acc in enumerate(accs, 1):
    row = {'round': r, 'round_bytes': 0 if silent else 1000,
           'cum_bytes': 0 if silent else 100 + 1000 * r, 'round_time_s': 1.5}
    if acc is not None:
      row['test_acc'] = acc
      if headline_client:
        row['client_acc_min'] = acc - 0.1
      elif client is not None:
        row['client_acc'] = client[r - 1]
    if extra is not None:
      row['hit_ratio'] = extra[r - 1]
    rows.append(row)
  with open(os.path.join(workdir, 'metrics.jsonl'), 'w') as f:
    f.writelines(json.dumps(r) + '\n' for r in rows)
  workdir_lib.write_json(os.path.join(workdir, 'summary.json'),
                         {'rounds': len(accs) if complete else len(accs) - 1,
                          'final_acc': accs[-1], 'wall_time_s': 99.0})
  workdir_lib.write_json(os.path.join(workdir, 'config.json'), {'rounds': rounds})


def test_the_figure_is_in_the_tables_unit_and_names_a_method_that_sends_nothing(tmp_path):
  """Accuracy as a fraction (compare.md's unit); a 0-byte cell (single) cannot stand on the
  log bytes axis, so the axis names it instead of dropping it silently."""
  out = str(tmp_path / 'sw')
  runs = sweep.plan(presets.digits(), [Variant('DS-FL', 'dsfl'), Variant('single', 'single')],
                    seeds=(0, 1), grid={}, out=out, overrides={'rounds': 3})
  sweep.write_plan(out, runs)
  for r in runs:
    _fake_run(r.workdir, [0.3, 0.5, 0.6], silent=r.variant.label == 'single')
  fig = sweep.report.figure_accuracy(sweep.aggregate(out))
  ax_r, ax_b = fig.axes
  assert '%' not in ax_r.get_ylabel() and '%' not in ax_b.get_ylabel()
  np.testing.assert_allclose(ax_r.get_lines()[0].get_ydata(), [0.3, 0.5, 0.6])
  assert len(ax_b.get_lines()) == 1                          # DS-FL alone has bytes
  note, = [t for t in ax_b.texts if t.get_gid() == 'zero-bytes']
  assert note.get_text() == 'not on the log axis (0 bytes): single'


def test_aggregate_numbers_by_hand(tmp_path):
  out = str(tmp_path / 'sw')
  runs = sweep.plan(presets.digits(), [Variant('A', 'dsfl'), Variant('B', 'fd')],
                    seeds=(0, 1, 2, 3), grid={}, out=out,
                    overrides={'rounds': 3, 'comm.thresholds': (0.55,)})
  sweep.write_plan(out, runs, thresholds=[0.55], metrics=['hit_ratio'])
  a = [r for r in runs if r.variant.label == 'A']
  # Round 2 is not evaluated (eval.every > 1): no test_acc in its row.
  _fake_run(a[0].workdir, [0.30, None, 0.50], client=[0.2, None, 0.30], extra=[0, .5, 1])
  _fake_run(a[1].workdir, [0.40, None, 0.60], client=[0.2, None, 0.35], extra=[0, .5, 1])
  _fake_run(a[2].workdir, [0.56, None, 0.70], client=[0.2, None, 0.40], extra=[0, .5, 1])
  _fake_run(a[3].workdir, [0.9, 0.9, 0.9], complete=False)    # unfinished: left out
  for r, final in zip([r for r in runs if r.variant.label == 'B'], (0.2, 0.3, 0.4, 0.5)):
    _fake_run(r.workdir, [0.1, 0.15, final], headline_client=True)
  cells = sweep.aggregate(out)
  assert [c['label'] for c in cells] == ['A', 'B']
  ca, cb = cells
  st = ca['stats']
  assert (ca['n'], ca['planned'], ca['incomplete'], ca['headline']) == (3, 4, [3], 'server')
  assert st['final_acc']['mean'] == pytest.approx(0.6)
  assert st['final_acc']['std'] == pytest.approx(0.1)
  assert st['best_acc']['mean'] == pytest.approx(0.6)
  assert st['last10_acc']['mean'] == pytest.approx(np.mean([0.4, 0.5, 0.63]))
  assert st['final_client_acc']['mean'] == pytest.approx(0.35)
  assert st['final_client_acc']['std'] == pytest.approx(0.05)
  # 0.55 is never reached by seed 0; seed 1 reaches it in round 3, seed 2 in round 1.
  assert ca['reached'] == {'0.55': (2, 3)}
  assert st['rounds_to_0.55']['mean'] == pytest.approx(2.0)
  assert st['rounds_to_0.55']['std'] == pytest.approx(np.sqrt(2))
  assert st['bytes_to_0.55']['mean'] == pytest.approx(2100.0)
  assert st['total_bytes']['mean'] == pytest.approx(3100.0)
  assert st['bytes_per_round']['mean'] == pytest.approx(1000.0)
  assert st['wall_s']['mean'] == pytest.approx(4.5)      # sum of round_time_s
  assert st['hit_ratio']['mean'] == pytest.approx(0.5)
  assert st['hit_ratio']['std'] == pytest.approx(0.0)
  assert list(ca['curves'][0]['test_acc']['round']) == [1, 3]   # evaluated rounds only
  # FD-like rows: test_acc is the mean client accuracy, so it is the client series too.
  assert (cb['n'], cb['headline']) == (4, 'client')
  assert cb['stats']['final_client_acc']['mean'] == pytest.approx(0.35)
  assert cb['stats']['final_acc']['std'] == pytest.approx(np.std([.2, .3, .4, .5], ddof=1))
  assert sweep.legend_label(ca, 'test_acc') == 'A — server test acc'
  assert sweep.legend_label(cb, 'test_acc') == 'B — mean client test acc'

  paths = sweep.write_outputs(out, cells)
  with open(paths['csv']) as f:
    rows = list(csv.DictReader(f))
  assert rows[0]['variant'] == 'A' and rows[0]['n'] == '3' and rows[0]['planned'] == '4'
  assert float(rows[0]['final_acc_mean']) == pytest.approx(0.6)
  assert float(rows[0]['final_acc_std']) == pytest.approx(0.1)
  assert rows[0]['reached_0.55'] == '2/3' and rows[1]['reached_0.55'] == '0/4'
  assert float(rows[0]['hit_ratio_mean']) == pytest.approx(0.5)
  md = pathlib.Path(paths['md']).read_text()
  assert '| A | 3 of 4 | 0.600 ± 0.100 |' in md
  assert '2.0 ± 1.4 (2/3)' in md
  assert os.path.getsize(paths['test_acc']) > 0 and os.path.getsize(paths['client_acc']) > 0
  # One seed: the std is undefined ('–' in tables, 0 in the CSV) and n says so.
  one = sweep.aggregate(a[:1])
  assert results.fmt_stat(one[0]['stats']['final_acc']) == '0.500 ± –'
  assert '0.0' in sweep.csv_text(one, [0.55]).splitlines()[1].split(',')


# ------------------------------------------------------------ the command line
def test_bad_field_exits_2_before_anything_runs(tmp_path, capsys):
  out = tmp_path / 'out'
  config = f'--config={REPO / "configs/default.py"}'
  code = sweep.main([config, '--algorithms=dsfl,fd',
                     '--set', 'train.learing_rate=0.1', f'--out={out}'])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2
  assert len(err) == 1 and err[0].startswith('error: train.learing_rate=0.1 is not allowed')
  assert 'did you mean train.learning_rate' in err[0]
  assert not out.exists()
  assert sweep.main([config, '--algorithms=dsfl,fd', '--set',
                     'cache.duration=0,5', '--seeds=0,1', '--dry_run', f'--out={out}']) == 0
  text = capsys.readouterr().out
  assert '2 variant(s) x 2 grid cell(s) x 2 seed(s) = 8 runs' in text
  assert str(out / 'runs' / 'fd' / 'duration-5' / 'seed1') in text
  assert not out.exists()


@pytest.fixture(scope='module')
def finished_sweep(tmp_path_factory):
  """A 2-variant x 2-seed sweep of configs/default.py run with --jobs=2 (and its argv)."""
  out = tmp_path_factory.mktemp('sweep') / 'out'
  argv = ['--config=configs/default.py', '--algorithms=dsfl,single', '--seeds=0,1', '--jobs=2',
          f'--out={out}', '--set', 'checkpoint.every=1', '--metrics=cohort_entropy']
  for s in TINY_SETS:
    argv += ['--set', s]
  proc = _cli(*argv)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return out, argv, proc.stdout


OUTPUTS = ('compare.csv', 'compare.md', 'sweep.json', 'accuracy_test_acc.png',
           'accuracy_client_acc.png')


@pytest.mark.slow
def test_cli_runs_then_skips_everything(finished_sweep):
  out, argv, stdout = finished_sweep
  assert stdout.count('] done ') == 4 and 'start' in stdout
  for name in ('dsfl/seed0', 'dsfl/seed1', 'single/seed0', 'single/seed1'):
    summary = json.loads((out / 'runs' / name / 'summary.json').read_text())
    assert summary['rounds'] == 2 and not summary.get('stopped_by')
    assert (out / 'runs' / name / 'sweep.log').exists()
  with open(out / 'compare.csv') as f:
    rows = list(csv.DictReader(f))
  assert [(r['variant'], r['n']) for r in rows] == [('dsfl', '2'), ('single', '2')]
  assert rows[0]['cohort_entropy_mean']
  plan = json.loads((out / 'sweep.json').read_text())
  assert plan['seeds'] == [0, 1] and plan['overrides']['rounds'] == 2
  assert [v['label'] for v in plan['variants']] == ['dsfl', 'single']
  before = {n: (out / n).read_bytes() for n in OUTPUTS}
  again = _cli(*argv)
  assert again.returncode == 0, again.stderr
  assert again.stdout.count('] skipped') == 4 and ' start ' not in again.stdout
  assert {n: (out / n).read_bytes() for n in OUTPUTS} == before


@pytest.mark.slow
def test_cli_resumes_an_unfinished_run(finished_sweep):
  out, argv, _ = finished_sweep
  run = out / 'runs' / 'dsfl' / 'seed0'
  rows = workdir_lib.read_metrics(str(run))
  # As if it had been killed during round 2: its row, summary and checkpoint are gone.
  (run / 'metrics.jsonl').write_text(json.dumps(rows[0]) + '\n')
  (run / 'summary.json').unlink()
  shutil.rmtree(run / 'checkpoints' / '2')
  proc = _cli(*argv)
  assert proc.returncode == 0, proc.stderr
  assert 'start    dsfl/seed0  (resuming from its checkpoint)' in proc.stdout
  assert 'resumed after round 1' in proc.stdout
  assert proc.stdout.count('] skipped') == 3
  after = workdir_lib.read_metrics(str(run))
  assert after[0] == rows[0]            # round 1 was kept, not recomputed (same round_time_s)
  assert [r['round'] for r in after] == [1, 2]
  assert after[1]['test_acc'] == pytest.approx(rows[1]['test_acc'], abs=1e-6)
  assert 'resumed from' in (run / 'sweep.log').read_text()
  assert json.loads((run / 'summary.json').read_text())['rounds'] == 2


def test_a_worker_that_fails_to_end_still_lets_the_sweep_end(tmp_path, monkeypatch):
  """A slot's worker raising as it is retired (here: a stand-in's error) is that slot's
  problem: the sweep still hears the slot end and returns, where it once waited forever."""
  import threading  # pylint: disable=g-import-not-at-top
  from tests.shared import tiny_config  # pylint: disable=g-import-not-at-top

  class BrokenWorker:
    def __init__(self, env):
      del env
      self.count, self.err = 0, None

    def ask(self, rundir):
      del rundir
      self.count += 1
      return {'status': 'failed', 'message': 'not run'}

    def retire(self):
      raise OSError('cannot close')

  monkeypatch.setattr(sweep.workers, 'Worker', BrokenWorker)
  monkeypatch.setattr(threading, 'excepthook', lambda args: None)   # the slot's own report
  runs = sweep.plan(tiny_config('single', rounds=1), [Variant('single', 'single')], [0, 1], {},
                    str(tmp_path / 'out'))
  got = []
  t = threading.Thread(target=lambda: got.extend(sweep.execute(runs, jobs=2, log=None)),
                       daemon=True)
  t.start()
  t.join(60)
  assert not t.is_alive(), 'the sweep waited for a slot that had ended'
  assert [r.status for r in got] == ['failed', 'failed']


@pytest.mark.slow
def test_cli_reports_failed_runs_and_goes_on(tmp_path):
  out = tmp_path / 'out'
  argv = ['--config=configs/default.py', '--algorithms=single', '--seeds=0,1', f'--out={out}']
  for s in TINY_SETS:
    if not s.startswith('data.source='):
      argv += ['--set', s]
  argv += ['--set', 'data.source=npz:/nonexistent/mnist.npz']   # validation does not read files
  proc = _cli(*argv)
  assert proc.returncode == 1
  assert proc.stdout.count('] FAILED') == 2      # the second run was still tried
  assert 'failed: single/seed0: error:' in proc.stderr
  assert (out / 'compare.md').exists()


@pytest.mark.slow
def test_cli_keeps_a_diverged_run_as_a_result(tmp_path):
  """A run whose round goes non-finite is recorded (diverged.json), counted and never rerun."""
  out = tmp_path / 'out'
  argv = ['--config=configs/default.py', '--algorithms=single', '--seeds=0', f'--out={out}']
  for s in TINY_SETS:
    argv += ['--set', s]
  argv += ['--set', 'train.learning_rate=1e30']   # the first steps overflow
  proc = _cli(*argv)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert '] DIVERGED single/seed0  ' in proc.stdout and '1 diverged' in proc.stdout
  wd = out / 'runs' / 'single' / 'seed0'
  record = json.loads((wd / sweep.DIVERGED_FILE).read_text())
  assert record['round'] == 1 and 'NaN or Inf' in record['message']
  cells = sweep.aggregate(str(out))
  assert (cells[0]['n'], cells[0]['diverged'], cells[0]['incomplete']) == (0, {0: 1}, [])
  assert 'Diverged (a round left NaN or Inf; not in n): single: seed 0 at round 1.' in (
      out / 'compare.md').read_text()
  again = _cli(*argv)
  assert again.returncode == 0 and '] start ' not in again.stdout
  assert '] diverged single/seed0  (diverged at round 1 in an earlier call' in again.stdout


# ------------------------------------------------------------ registrations in the config file
GUIDE = REPO / 'docs' / 'custom_algorithm.md'

# A config file that registers a model and a data source of its own (its arrays made
# deterministically, since every worker executes the file again).
REGISTERING_CONFIG = '''
import flax.linen as nn
import numpy as np

from fedjax_kd import models
from fedjax_kd.config import presets
from fedjax_kd.data import sources


class TwoLayer(nn.Module):
  num_classes: int
  hidden: int

  @nn.compact
  def __call__(self, x, train=False, mask=None, embed=False):
    h = nn.relu(nn.Dense(self.hidden)(x.reshape(x.shape[0], -1)))
    return h if embed else nn.Dense(self.num_classes)(h)


models.register('two_layer_sweep', lambda num_classes, width, input_shape: TwoLayer(
    num_classes=num_classes, hidden=max(1, int(16 * width))))
rs = np.random.RandomState(0)
x = rs.randint(0, 256, (400, 8, 8)).astype(np.uint8)
y = (np.arange(400) % 4).astype(np.int32)
sources.register_source('mine_sweep', sources.ArraySource(x[:300], y[:300], x[300:], y[300:]))


def get_config():
  c = presets.digits('dsfl')
  c.data.source = 'mine_sweep'
  c.clients.models = ('two_layer_sweep@0.5',)
  c.server.model = 'two_layer_sweep@0.5'
  return c
'''


def _guide_config(path):
  """docs/custom_algorithm.md's two python blocks as one config file, as the guide says."""
  import re  # pylint: disable=g-import-not-at-top
  path.write_text('\n\n'.join(re.findall(r'```python\n(.*?)```', GUIDE.read_text(), flags=re.S)))
  return path


def test_a_config_group_in_an_error_is_one_line():
  import ml_collections  # pylint: disable=g-import-not-at-top
  group = ml_collections.ConfigDict({'quantile': 0.5, 'temperature': 1.0})
  e = ConfigError('median_distill', group, 'a known field of the top level')
  assert str(e) == ("median_distill={'quantile': 0.5, 'temperature': 1.0} is not allowed: "
                    'expected a known field of the top level.')
  assert '\n' not in str(ConfigError('x', np.zeros((30, 30)), 'a number'))


def test_a_run_file_names_the_config_file_its_worker_executes(tmp_path, monkeypatch):
  """plan() records the file as an absolute path, and checks each run the worker's way."""
  cfg = tmp_path / 'conf.py'
  cfg.write_text('from fedjax_kd.config import presets\n\ndef get_config():\n'
                 "  return presets.digits('dsfl')\n")
  monkeypatch.chdir(tmp_path)
  base = config_lib.load_file('conf.py')
  runs = sweep.plan(base, [Variant('dsfl', 'dsfl')], [0], {}, str(tmp_path / 'out'),
                    config_file='conf.py')
  doc = sweep.planning.run_file(runs[0])
  assert doc['config_file'] == str(cfg)
  as_json = lambda c: c.to_json_best_effort(sort_keys=True)
  assert as_json(sweep.planning.config_of(doc)) == as_json(runs[0].config)
  # Shipped names are recorded as their files.
  assert config_lib.absolute_path('default').endswith(os.path.join('configs', 'default.py'))
  assert config_lib.absolute_path(f'{cfg}:x') == f'{cfg}:x'


@pytest.mark.slow
def test_the_guides_sweep_of_a_registered_algorithm_finishes_every_run(tmp_path):
  """docs/custom_algorithm.md's sweep: the workers execute my_median.py, so they know
  median_distill (before, every run failed with 'median_distill=... is not allowed')."""
  _guide_config(tmp_path / 'my_median.py')
  proc = subprocess.run(
      [sys.executable, '-m', 'fedjax_kd.sweep', '--config=my_median.py', '--seeds=0,1',
       '--out=runs/median_sweep', '--set', 'rounds=1', '--set', 'median_distill.quantile=0.25'],
      cwd=tmp_path, env=dict(sweep_env(), PYTHONPATH=str(REPO)), capture_output=True, text=True,
      timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.count('] done ') == 2
  run = tmp_path / 'runs/median_sweep/runs/median-distill/seed1'
  assert json.loads((run / 'sweep_run.json').read_text())['config_file'] == str(
      tmp_path / 'my_median.py')
  assert json.loads((run / 'summary.json').read_text())['algorithm'] == 'median_distill'
  assert json.loads((run / 'config.json').read_text())['median_distill']['quantile'] == 0.25


@pytest.mark.slow
def test_a_sweep_of_a_config_that_registers_a_model_and_a_source_finishes(tmp_path):
  (tmp_path / 'reg.py').write_text(REGISTERING_CONFIG)
  argv = ['--config=reg.py', '--algorithms=dsfl,single', '--seeds=0', '--jobs=2',
          '--out=out', '--set', 'rounds=1', '--set', 'clients.num_clients=4',
          '--set', 'data.num_public=60', '--set', 'distill.public_per_round=30',
          '--set', 'distill.batch_size=30',
          '--set', 'log.tensorboard=False']
  proc = subprocess.run([sys.executable, '-m', 'fedjax_kd.sweep', *argv], cwd=tmp_path,
                        env=dict(sweep_env(), PYTHONPATH=str(REPO)), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.count('] done ') == 2
  for name in ('dsfl', 'single'):
    cfg = json.loads((tmp_path / 'out/runs' / name / 'seed0/config.json').read_text())
    assert cfg['data']['source'] == 'mine_sweep'
    assert cfg['clients']['models'] == ['two_layer_sweep@0.5']
