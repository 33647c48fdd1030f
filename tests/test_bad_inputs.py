"""Every bad input to the command line: exit 2, one line naming the flag, field or file, and
nothing computed.

The cases run through :func:`fedjax_kd.main.cli` in this process (the command's own code
path after absl's flags; a subprocess per case would be a JAX import each). Training is
made to fail loudly: a case that got as far as initialising models or playing a round is a
test failure, not a pass. A few cases also go through ``python -m fedjax_kd.main`` to pin
the real entry point.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_kd import main as main_lib
from fedjax_kd import runner
from fedjax_kd.running import session as session_lib
from fedjax_kd.running import workdir as workdir_lib
from tests.shared import TINY_FILE
from tests.test_main import REPO
from tests.test_sweep import sigint_at_default

DEFAULT = os.path.join(REPO, 'configs', 'default.py')


def _npz(path, *, n=200, classes=10, y_train=None, y_test=None, x_train=None, x_test=None,
         drop=None, **extra):
  """A small Keras-layout npz (8x8 grey images) with any array replaced."""
  rng = np.random.default_rng(0)
  arrays = {'x_train': rng.integers(0, 255, (n, 8, 8), dtype=np.uint8),
            'y_train': np.arange(n) % classes,
            'x_test': rng.integers(0, 255, (n // 2, 8, 8), dtype=np.uint8),
            'y_test': np.arange(n // 2) % classes}
  for k, v in (('x_train', x_train), ('y_train', y_train), ('x_test', x_test),
               ('y_test', y_test)):
    if v is not None:
      arrays[k] = v
  arrays.update(extra)
  if drop:
    del arrays[drop]
  np.savez(path, **arrays)
  return f'npz:{path}'


def _nan_images(n):
  x = np.random.default_rng(1).random((n, 8, 8)).astype(np.float32)
  x[7, 3, 3] = np.nan
  return x


# (id, argv after the program, substring the line must contain). {tmp} is the test's folder,
# {tiny} a config file of the test suite's tiny setting, {w} a fresh workdir.
def _cases(tmp):
  def npz(name, **kw):
    return _npz(os.path.join(tmp, f'{name}.npz'), **kw)

  files = {
      'syntax.py': 'x = (\n',
      'imports.py': 'import not_a_module_anywhere\n',
      'noget.py': 'def f():\n  return 1\n',
      'none.py': 'def get_config():\n  return None\n',
      'raises.py': 'def get_config():\n  raise RuntimeError("boom")\n',
      'adict.py': 'def get_config():\n  return {"rounds": 3}\n',
      'tiny.py': TINY_FILE,
  }
  for name, text in files.items():
    with open(os.path.join(tmp, name), 'w') as f:
      f.write(text)
  with open(os.path.join(tmp, 'not_npz.npz'), 'w') as f:
    f.write('hello')
  with open(os.path.join(tmp, 'a_file'), 'w') as f:
    f.write('x')
  cfg = f'--config={DEFAULT}'
  tiny = f'--config={tmp}/tiny.py'
  fe = f'--config={REPO}/configs/fedentopt_digits.py'
  return [
      # the config file
      ('no config', [], '--config'),
      ('config missing', [f'--config={tmp}/nope.py'], 'nope.py does not exist'),
      ('config is a directory', [f'--config={tmp}'], 'is a directory'),
      ('config syntax error', [f'--config={tmp}/syntax.py'], 'SyntaxError at line 1'),
      ('config import error', [f'--config={tmp}/imports.py'], 'not_a_module_anywhere'),
      ('config without get_config', [f'--config={tmp}/noget.py'], 'get_config()'),
      ('get_config returns None', [f'--config={tmp}/none.py'], 'returned NoneType'),
      ('get_config raises', [f'--config={tmp}/raises.py'], 'RuntimeError: boom'),
      ('get_config returns a dict', [f'--config={tmp}/adict.py'], 'returned dict'),
      # flags and override names
      ('misspelt field', [cfg, '--config.train.learing_rate=0.1'],
       'did you mean train.learning_rate?'),
      ('misspelt top-level field', [cfg, '--config.roundz=3'], 'did you mean rounds?'),
      ('misspelt group', [cfg, '--config.trian.epochs=3'], 'did you mean train?'),
      ('a group set as a field', [cfg, '--config.train=3'], "'train' is a group"),
      ('a field used as a group', [cfg, '--config.rounds.x=3'], "'rounds' is a field"),
      ('override with a space', [cfg, '--config.roundz', '3'], 'did you mean rounds?'),
      ('unknown flag', [cfg, '--bogus=1'], '--bogus'),
      ('misspelt flag', [cfg, '--workdi=x'], 'did you mean --workdir?'),
      ('integer flag', [cfg, '--num_processes=x'], '--num_processes'),
      ('enum flag', [cfg, '--distributed=maybe'], '--distributed'),
      # values of the wrong type
      ('rounds not a number', [cfg, '--config.rounds=abc'], '--config.rounds'),
      ('seed a float', [cfg, '--config.seed=1.5'], 'seed'),
      ('lr a string', [cfg, '--config.train.learning_rate=fast'], 'train.learning_rate'),
      ('models a number', [cfg, '--config.clients.models=5'], 'clients.models'),
      ('flag a number', [cfg, '--config.eval.clients=3'], 'eval.clients'),
      # ranges and choices
      ('rounds 0', [cfg, '--config.rounds=0'], 'rounds'),
      ('rounds negative', [cfg, '--config.rounds=-5'], 'rounds'),
      ('unknown algorithm', [cfg, '--config.algorithm=nope'], 'algorithm'),
      ('more clients than samples', [cfg, '--config.clients.num_clients=5000'],
       'clients.num_clients=5000'),
      ('no clients', [cfg, '--config.clients.num_clients=0'], 'clients.num_clients'),
      ('negative lr', [cfg, '--config.train.learning_rate=-1'], 'train.learning_rate'),
      ('NaN lr', [cfg, '--config.train.learning_rate=nan'], 'train.learning_rate'),
      ('batch 0', [cfg, '--config.train.batch_size=0'], 'train.batch_size'),
      ('negative epochs', [cfg, '--config.train.epochs=-1'], 'train.epochs'),
      ('unknown optimizer', [cfg, '--config.train.optimizer=lbfgs'], 'train.optimizer'),
      ('temperature 1e-30', [cfg, '--config.dsfl.temperature=1e-30'], 'dsfl.temperature'),
      ('temperature 0', [cfg, '--config.dsfl.temperature=0.0'], 'dsfl.temperature'),
      ('temperature inf', [cfg, '--config.dsfl.temperature=inf'], 'dsfl.temperature'),
      # DS-FL's attacks
      ('noisy classes above half', [cfg, '--config.data.noisy_classes=6'],
       'data.noisy_classes=6'),
      ('open-set noise without a source', [cfg, '--config.data.num_public_noise=10'],
       'data.public_noise_source'),
      ('more open-set noise than its source has',
       [cfg, '--config.data.public_noise_source=synthetic:100',
        '--config.data.num_public_noise=500'], 'data.num_public_noise=500'),
      ('open-set noise for acepfl', [f'--config={REPO}/configs/acepfl_digits.py',
                                      '--config.data.public_noise_source=synthetic:100',
                                      '--config.data.num_public_noise=10'],
       'data.num_public_noise'),
      ('unknown aggregation', [cfg, '--config.dsfl.aggregation=max'], 'dsfl.aggregation'),
      ('negative alpha', [cfg, '--config.data.alpha=-1.0'], 'data.alpha'),
      ('unknown partition', [cfg, '--config.data.partition=nope'], 'data.partition'),
      ('unknown normalisation', [cfg, '--config.data.normalize=nope'], 'data.normalize'),
      ('public larger than data', [cfg, '--config.data.num_public=100000'], 'data.num_public'),
      ('per-round sample over public', [cfg, '--config.distill.public_per_round=100000'],
       'distill.public_per_round'),
      ('distill batch over per-round sample', [cfg, '--config.distill.batch_size=301'],
       'distill.batch_size'),
      ('unknown selection', [cfg, '--config.selection.method=nope'], 'selection.method'),
      ('participation over 1', [cfg, '--config.clients.participation=1.5'],
       'clients.participation'),
      ('unknown model', [cfg, "--config.clients.models=('nope@1.0',)"], 'clients.models'),
      ('unknown server model', [cfg, '--config.server.model=nope@1.0'], 'server.model'),
      ('eval every 0', [cfg, '--config.eval.every=0'], 'eval.every'),
      ('keep 0 checkpoints', [cfg, '--config.checkpoint.keep=0'], 'checkpoint.keep'),
      ('unknown byte rules', [cfg, '--config.comm.rules=nope'], 'comm.rules'),
      ('threshold over 1', [cfg, '--config.comm.thresholds=(1.5,)'], 'comm.thresholds'),
      ('unknown init', [cfg, '--config.model.init=nope'], 'model.init'),
      ('unknown store', [cfg, '--config.clients.store=nope'], 'clients.store'),
      ('unknown cache mode', [cfg, '--config.cache.mode=maybe'], 'cache.mode'),
      ('fedentopt schedule too large', [fe, '--config.rounds=1000000000'],
       'its schedule is computed up front and would take'),
      # data (through the loader, before any model exists)
      ('unknown source', [cfg, '--config.data.source=nope'], 'data.source'),
      ('npz missing', [tiny, f'--config.data.source=npz:{tmp}/none.npz'], 'none.npz'),
      ('npz not an archive', [tiny, f'--config.data.source=npz:{tmp}/not_npz.npz'],
       'not_npz.npz'),
      ('npz without y_test', [tiny, '--config.data.source=' + npz('noy', drop='y_test')],
       "missing keys ['y_test']"),
      ('npz x/y lengths', [tiny, '--config.data.source=' + npz('len', y_train=np.arange(50))],
       'x_train has 200 rows but y_train has 50'),
      ('npz one class', [tiny, '--config.data.source=' + npz('one', classes=1)],
       'the training split has 1 class'),
      ('npz label gaps', [tiny, '--config.data.source=' + npz(
          'gaps', y_train=(np.arange(200) % 10) * 100, y_test=(np.arange(100) % 10) * 100)],
       'labels must be 0 .. C-1'),
      ('npz unseen test classes', [tiny, '--config.data.source=' + npz(
          'unseen', y_test=np.arange(100) % 12, classes=10)], 'labels the training split lacks'),
      ('npz NaN pixels', [tiny, '--config.data.source=' + npz(
          'nan', x_train=_nan_images(200))], 'x_train has NaN or Inf inputs in 1 rows'),
      ('npz empty test split', [tiny, '--config.data.source=' + npz(
          'empty', x_test=np.zeros((0, 8, 8), np.uint8), y_test=np.zeros(0, int))],
       'the test split is empty'),
      ('npz pickled objects', [tiny, '--config.data.source=' + npz(
          'pickled', y_test=np.array([{'a': 1}] * 100, dtype=object))], 'pickled'),
      ('batch over every client', [cfg, '--config.train.batch_size=100000'],
       'train.batch_size=100000'),
      # the workdir
      ('workdir is a file', [cfg, f'--workdir={tmp}/a_file'], 'a_file cannot be used'),
      ('workdir under a file', [cfg, f'--workdir={tmp}/a_file/run'], 'a_file/run cannot be'),
  ]


def _forbid_compute(monkeypatch):
  """Model initialisation and rounds raise: a case that reaches them fails the test."""
  def boom(*a, **k):
    raise AssertionError('a bad input reached compute')
  monkeypatch.setattr(session_lib, 'init_state', boom)
  monkeypatch.setattr(session_lib, 'play_round', boom)


@pytest.fixture
def no_compute(monkeypatch):
  _forbid_compute(monkeypatch)


def _check(argv, expected, capsys, workdir=None):
  capsys.readouterr()
  if workdir is not None and not any(a.startswith('--workdir') for a in argv):
    argv = [*argv, f'--workdir={workdir}']
  code = main_lib.cli(['fedjax_kd.main', *argv])
  err = capsys.readouterr().err
  lines = err.strip().splitlines()
  assert code == 2, (argv, err)
  assert len(lines) == 1 and lines[0].startswith('error: '), (argv, err)
  assert expected in lines[0], (argv, lines[0])
  return lines[0]


def test_every_bad_input_is_one_line_and_exit_2(tmp_path, capsys, no_compute):
  cases = _cases(str(tmp_path))
  assert len(cases) >= 60 and len({c[0] for c in cases}) == len(cases)
  for i, (name, argv, expected) in enumerate(cases):
    work = tmp_path / f'w{i}'
    _check(argv, expected, capsys, workdir=work)
    # Nothing was computed or written: not even the workdir is left behind.
    assert not work.exists(), name


def _finished(tmp_path, rounds=3):
  """A real finished tiny run (checkpoints at every round) to resume from."""
  from fedjax_kd import config as config_lib
  from tests.shared import tiny_config
  c = tiny_config(rounds=rounds)
  c.checkpoint.every = 1
  work = tmp_path / 'done'
  runner.run(config_lib.validate(c), str(work), progress=False)
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(TINY_FILE)
  return work, cfg


@pytest.mark.slow
def test_resume_refusals_are_one_line(tmp_path, capsys, monkeypatch):
  work, cfg = _finished(tmp_path)
  _forbid_compute(monkeypatch)    # only after the real run above
  before = (work / 'metrics.jsonl').read_text()
  # Fewer rounds than the workdir has run: refused (it used to report 3 rounds while
  # config.json said 2).
  line = _check([f'--config={cfg}', '--config.rounds=2', f'--workdir={work}'], 'rounds=2',
                capsys)
  assert 'at least 3' in line
  # Another config on the same workdir.
  _check([f'--config={cfg}', '--config.seed=5', f'--workdir={work}'], '--workdir', capsys)
  # Checkpoints without the config.json that says what they belong to.
  (work / 'config.json').unlink()
  _check([f'--config={cfg}', f'--workdir={work}'], 'has checkpoints but no config.json',
         capsys)
  assert (work / 'metrics.jsonl').read_text() == before


def test_a_locked_workdir_is_one_line(tmp_path, capsys, no_compute):
  work = tmp_path / 'w'
  with workdir_lib.DirLock(str(work)):
    line = _check([f'--config={DEFAULT}', f'--workdir={work}'], 'is in use by another',
                  capsys)
  assert f'pid {os.getpid()}' in line


def test_an_unwritable_workdir_is_one_line(tmp_path, capsys, no_compute, monkeypatch):
  """As a user without write permission (or on a read-only file system) sees it: creating
  anything in the folder fails with EACCES / EROFS. Simulated, so that it also runs as root."""
  import errno
  real_open = os.open

  def deny(path, *a, **k):
    if str(path).endswith(workdir_lib.LOCK):
      raise PermissionError(errno.EACCES, 'Permission denied', path)
    return real_open(path, *a, **k)

  monkeypatch.setattr(os, 'open', deny)
  work = tmp_path / 'ro'
  work.mkdir()
  line = _check([f'--config={DEFAULT}', f'--workdir={work}'], 'cannot be used', capsys)
  assert line.endswith('(Permission denied).')
  assert os.listdir(work) == []


@pytest.mark.skipif(os.geteuid() == 0, reason='root writes into read-only folders')
def test_a_read_only_workdir_is_one_line(tmp_path, capsys, no_compute):
  work = tmp_path / 'ro'
  work.mkdir()
  work.chmod(0o555)
  try:
    _check([f'--config={DEFAULT}', f'--workdir={work}'], 'cannot be used', capsys)
  finally:
    work.chmod(0o755)


@pytest.mark.parametrize('argv,expected', [
    (['--config.train.learing_rate=0.1'], 'did you mean train.learning_rate?'),
    (['--config.rounds=abc'], '--config.rounds'),
    (['--config.clients.num_clients=5000'], 'clients.num_clients=5000'),
])
def test_the_real_command_line(tmp_path, argv, expected):
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={DEFAULT}',
                      f'--workdir={tmp_path / "w"}', *argv], cwd=REPO, capture_output=True,
                     text=True, env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'),
                     timeout=300)
  assert r.returncode == 2, r.stderr
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ') and expected in lines[0], lines
  assert not (tmp_path / 'w').exists()    # refused before the workdir was touched


def test_help_lists_the_flags():
  r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', '--help'], cwd=REPO,
                     capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'))
  assert r.returncode == 0
  for flag in ('--config', '--workdir', '--[no]resume', '--distributed'):
    assert flag in r.stdout


def test_the_distributed_modes_are_the_modules():
  from fedjax_kd.running import distributed
  assert main_lib.DISTRIBUTED_MODES == distributed.MODES


def _start(argv):
  return subprocess.Popen([sys.executable, '-m', 'fedjax_kd.main', *argv], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu'),
                          preexec_fn=sigint_at_default)


def test_ctrl_c_before_the_first_round_is_one_line(tmp_path):
  import signal
  import time
  work = tmp_path / 'w'
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(TINY_FILE)
  proc = _start([f'--config={cfg}', '--config.train.epochs=300', f'--workdir={work}'])
  # The lock is taken once the config is valid; loading data and compiling round 1 follow
  # (seconds), then a round of 300 local epochs: the Ctrl-C lands before it ends.
  t0 = time.time()
  while not (work / workdir_lib.LOCK).exists():
    assert proc.poll() is None and time.time() - t0 < 300, proc.stderr.read()
    time.sleep(0.05)
  time.sleep(0.5)
  proc.send_signal(signal.SIGINT)
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  assert err.strip().splitlines()[-1].startswith('error: interrupted (Ctrl-C)')


@pytest.mark.slow
def test_a_second_ctrl_c_in_a_round_is_one_line(tmp_path):
  import signal
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(TINY_FILE)
  # Rounds of a second or so (many local epochs), so both signals land in one round.
  proc = _start([f'--config={cfg}', '--config.rounds=500', '--config.checkpoint.every=0',
                 '--config.train.epochs=300', f'--workdir={tmp_path / "w"}'])
  lines = []
  for line in proc.stderr:        # wait until the rounds run
    lines.append(line)
    if line.startswith('round    2/'):
      proc.send_signal(signal.SIGINT)    # the first: stop after this round ...
    if line.startswith('SIGINT: stopping after this round'):
      proc.send_signal(signal.SIGINT)    # ... the second, once the first was handled: now
      break
  rest = proc.stderr.read()
  proc.wait(timeout=300)
  err = ''.join(lines) + rest
  assert proc.returncode == 130, err
  assert 'Traceback' not in err
  assert [ln for ln in err.splitlines() if ln.startswith('error: ')] == [
      'error: interrupted (Ctrl-C); rerun the same command to resume from the newest '
      'checkpoint, if the run had saved one']


def _second_ctrl_c(stop):
  """What a second Ctrl-C does inside ``stop``'s block: the handler's own call, as the
  signal machinery makes it, after a first one that asked for a stop."""
  import signal
  stop._handle(signal.SIGINT, None)   # pylint: disable=protected-access
  assert stop.signum == signal.SIGINT and not stop.aborted
  stop._handle(signal.SIGINT, None)   # pylint: disable=protected-access


def test_a_second_ctrl_c_wrapped_by_c_code_still_leaves_as_a_keyboard_interrupt():
  # CI saw this: the second SIGINT landed in a Python method numpy's C code called back
  # (a dtype's __hash__), and C turned the KeyboardInterrupt into a SystemError.
  stop = runner._StopOnSignal(lambda s: None)   # pylint: disable=protected-access
  with pytest.raises(KeyboardInterrupt) as got:
    with stop:
      try:
        _second_ctrl_c(stop)
      except KeyboardInterrupt as e:
        raise SystemError('returned a result with an exception set') from e
  assert stop.aborted and isinstance(got.value.__cause__, SystemError)


def test_a_second_ctrl_c_dropped_by_c_code_aborts_at_the_end_of_the_round():
  # A garbage-collector callback prints the KeyboardInterrupt and drops it: the round goes on,
  # and the check after it raises the abort again.
  stop = runner._StopOnSignal(lambda s: None)   # pylint: disable=protected-access
  with pytest.raises(KeyboardInterrupt):
    with stop:
      try:
        _second_ctrl_c(stop)
      except KeyboardInterrupt:
        pass
      stop.check()


def test_a_first_ctrl_c_or_other_errors_are_left_as_they_are():
  stop = runner._StopOnSignal(lambda s: None)   # pylint: disable=protected-access
  with pytest.raises(SystemError):
    with stop:
      import signal
      stop._handle(signal.SIGINT, None)   # pylint: disable=protected-access
      stop.check()                        # one Ctrl-C: a stop after the round, not an abort
      raise SystemError('not an interrupt')
  assert not stop.aborted
