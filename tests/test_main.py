"""End to end through the CLI and the runner: files, progress, resume, baselines."""

import json
import os
import re
import subprocess
import sys

import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import runner
from tests.shared import TINY_FILE, tiny_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow
def test_cli_writes_config_metrics_and_summary(tmp_path):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(TINY_FILE)
  workdir = tmp_path / 'run'
  env = dict(os.environ, PYTHONPATH=REPO)
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                      f'--workdir={workdir}', '--config.rounds=2'],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr
  assert 'round    2/2' in r.stderr
  assert json.loads((workdir / 'config.json').read_text())['rounds'] == 2
  rows = read_rows(workdir)
  assert [row['round'] for row in rows] == [1, 2]
  csv_lines = (workdir / 'metrics.csv').read_text().strip().splitlines()
  assert len(csv_lines) == 3 and 'test_acc' in csv_lines[0]
  summary = json.loads((workdir / 'summary.json').read_text())
  # DS-FL rules: 4 uploads + 1 multicast of [100, 10] float32 per round, plus ComU@I once.
  per_round = (4 + 1) * 100 * 10 * 4
  comu_i = 150 * 8 * 8 * 4
  assert rows[0]['round_bytes'] == per_round
  assert summary['setup_bytes'] == comu_i
  assert summary['cum_bytes'] == comu_i + 2 * per_round
  # What produced it: the seed, the versions, the devices, the commit of a git checkout.
  import jax
  assert summary['seed'] == 0
  assert summary['versions']['jax'] == jax.__version__ and summary['versions']['python']
  assert summary['device'] == {'platform': 'cpu', 'kind': 'cpu', 'count': 1, 'processes': 1}
  commit = summary['git_commit']
  assert commit is None or len(commit.split('+')[0]) == 40
  # The header line names the run before anything compiles; round lines carry both accuracies.
  err = r.stderr.splitlines()
  assert err[0].startswith('fedjax_kd ') and ' | dsfl | 4 clients (all every round) | ' in err[0]
  assert 'data synthetic:600: ' in err[0] and ' public, ' in err[0] and ' | cpu x1 | ' in err[0]
  assert re.search(r" \| memory (about|at most) [0-9.]+ (MiB|GiB), all clients at once$",
                   err[0]), err[0]   # the estimate
  assert re.search(r'round    1/2  acc \d\.\d{4}  clients \d\.\d{4}  sent', r.stderr), r.stderr


def test_cli_bad_input_exits_with_message(tmp_path):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(TINY_FILE)
  env = dict(os.environ, PYTHONPATH=REPO)
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                      f'--workdir={tmp_path / "w"}', '--config.data.alpha=-1'],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 2
  assert 'data.alpha=-1.0' in r.stderr and 'expected' in r.stderr
  assert not (tmp_path / 'w').exists()  # nothing ran


@pytest.mark.slow
def test_resume_loses_no_round_and_matches_uninterrupted(tmp_path):
  full = tiny_config(rounds=4)
  full.checkpoint.every = 2
  runner.run(config_lib.validate(full), str(tmp_path / 'a'), progress=False)
  first = tiny_config(rounds=2)
  first.checkpoint.every = 2
  runner.run(config_lib.validate(first), str(tmp_path / 'b'), progress=False)
  summary = runner.run(config_lib.validate(full), str(tmp_path / 'b'), progress=False)
  assert summary['rounds_run_this_call'] == 2
  a, b = read_rows(tmp_path / 'a'), read_rows(tmp_path / 'b')
  assert [r['round'] for r in b] == [1, 2, 3, 4]
  for ra, rb in zip(a, b):
    assert ra['test_acc'] == rb['test_acc']
    assert ra['cum_bytes'] == rb['cum_bytes']


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_until_stops_after_a_round_with_the_whole_runs_schedules(tmp_path):
  # ACE-pFL's schedules read spec.rounds: a run cut at round 1 still sees all 3 rounds, so
  # its first row is the whole run's (how an archived run's start is replayed).
  full = tiny_config('acepfl', rounds=3)
  runner.run(config_lib.validate(full), str(tmp_path / 'a'), progress=False)
  runner.run(config_lib.validate(full), str(tmp_path / 'b'), progress=False, until=1)
  a, b = read_rows(tmp_path / 'a'), read_rows(tmp_path / 'b')
  assert [r['round'] for r in b] == [1]
  assert b[0]['temperature'] == a[0]['temperature']
  assert b[0]['test_acc'] == a[0]['test_acc'] and b[0]['cum_bytes'] == a[0]['cum_bytes']


@pytest.mark.slow
def test_resume_refuses_a_different_config(tmp_path):
  c = tiny_config(rounds=1)
  c.checkpoint.every = 1
  runner.run(config_lib.validate(c), str(tmp_path), progress=False)
  c.dsfl.temperature = 0.5
  with pytest.raises(Exception, match='--workdir'):
    runner.run(config_lib.validate(c), str(tmp_path), progress=False)


@pytest.mark.slow
def test_resume_takes_a_field_the_old_config_lacks_at_its_default(tmp_path):
  """A run made before a field existed resumes (the field counts at its default), and a
  lacking field whose default differs from the new value is still a different config."""
  c = tiny_config(rounds=1)
  c.checkpoint.every = 1
  runner.run(config_lib.validate(c), str(tmp_path), progress=False)
  path = tmp_path / 'config.json'
  old = json.loads(path.read_text())
  del old['data']['dominant_fraction']     # as written before the field was added
  path.write_text(json.dumps(old))
  c.rounds = 2
  assert runner.run(config_lib.validate(c), str(tmp_path), progress=False)['rounds'] == 2
  path.write_text(json.dumps(old))
  c.rounds, c.data.dominant_fraction = 3, 0.5
  with pytest.raises(Exception, match='--workdir'):
    runner.run(config_lib.validate(c), str(tmp_path), progress=False)


@pytest.mark.parametrize('algorithm', ['fedavg', 'fd', 'single'])
@pytest.mark.slow
def test_baselines_run_end_to_end(tmp_path, algorithm):
  summary = runner.run(config_lib.validate(tiny_config(algorithm, rounds=2)), str(tmp_path),
                       progress=False)
  rows = read_rows(tmp_path)
  assert len(rows) == 2 and 0.0 <= summary['final_acc'] <= 1.0
  if algorithm == 'single':
    assert summary['cum_bytes'] == 0
  if algorithm == 'fd':
    assert rows[0]['round_bytes'] == (4 + 1) * 10 * 10 * 4   # (K+1) N_L^2 4 B


def test_import_fedjax_kd_reaches_every_op_module():
  import fedjax_kd
  import jax.numpy as jnp
  probs = jnp.asarray([[[0.6, 0.3, 0.1]], [[0.4, 0.3, 0.3]]])
  era = fedjax_kd.ops.aggregate.era(fedjax_kd.ops.aggregate.mean_aggregate(probs), 0.1)
  assert float(era[0, 0]) == pytest.approx(0.8438, abs=1e-4)   # softmax([.5,.3,.2]/0.1)
  for name in fedjax_kd.ops._SUBMODULES:
    assert getattr(fedjax_kd.ops, name).__doc__
  for name in fedjax_kd._SUBMODULES:
    getattr(fedjax_kd, name)
  with pytest.raises(AttributeError):
    fedjax_kd.nope


def test_config_names_resolve_from_a_source_tree(monkeypatch):
  """`python -m fedjax_kd.main --config=default` inside a checkout after a plain
  `pip install .` imports the checkout's fedjax_kd/, which has no `configs` package: the
  names then resolve to the repository's configs/."""
  import importlib.resources  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib
  files = importlib.resources.files

  def no_configs_package(name):
    if name == 'fedjax_kd.configs':
      raise ModuleNotFoundError(name)
    return files(name)

  monkeypatch.setattr(importlib.resources, 'files', no_configs_package)
  assert os.path.samefile(config_lib.resolve_path('default'),
                          os.path.join(REPO, 'configs', 'default.py'))


def test_config_names_resolve_to_the_shipped_configs(tmp_path, monkeypatch):
  """--config=NAME finds configs/NAME.py (installed as fedjax_kd.configs) from any folder;
  a path is taken as given; an unknown name lists the shipped ones."""
  from fedjax_kd import config as config_lib
  from fedjax_kd import main as main_lib
  from fedjax_kd.errors import ConfigError
  shipped = config_lib.shipped_configs()
  on_disk = sorted(f[:-3] for f in os.listdir(os.path.join(REPO, 'configs'))
                   if f.endswith('.py') and not f.startswith('_'))
  assert sorted(shipped) == on_disk and 'default' in shipped
  monkeypatch.chdir(tmp_path)   # not the repository: configs/default.py is not a relative path
  assert os.path.samefile(config_lib.resolve_path('default'),
                          os.path.join(REPO, 'configs', 'default.py'))
  assert config_lib.resolve_path('dsfl_mnist:x').endswith(os.path.join('dsfl_mnist.py') + ':x')
  fv = main_lib.parse(['prog', '--config=default', '--config.rounds=3'])
  assert fv.config.rounds == 3 and fv.config.algorithm == 'dsfl'
  fv = main_lib.parse(['prog', '--config', 'default'])   # the two-argument form
  assert fv.config.algorithm == 'dsfl'
  with pytest.raises(ConfigError, match=r"--config='nosuch'.*shipped config name: .*default"):
    main_lib.parse(['prog', '--config=nosuch'])
  # A path is a path: ./default.py is the local file, 'default' the shipped config.
  (tmp_path / 'default.py').write_text('from tests.shared import tiny_config\n\n'
                                       'def get_config():\n  return tiny_config(algorithm="fd")\n')
  monkeypatch.syspath_prepend(REPO)
  assert main_lib.parse(['prog', '--config=default.py']).config.algorithm == 'fd'
  assert main_lib.parse(['prog', '--config=default']).config.algorithm == 'dsfl'
  # A folder named like a shipped config (a workdir ./dsfl_mnist) is not a config file.
  (tmp_path / 'dsfl_mnist').mkdir()
  assert os.path.samefile(config_lib.resolve_path('dsfl_mnist'),
                          os.path.join(REPO, 'configs', 'dsfl_mnist.py'))
  assert main_lib.parse(['prog', '--config=dsfl_mnist']).config.algorithm == 'dsfl'
