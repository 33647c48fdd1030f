"""The persistent compilation cache of the command lines, the compile lines and the ETA.

Every cache here is a folder of the test's own ``tmp_path``: never the user's
``~/.cache`` (conftest.py points ``$FEDJAX_KD_COMPILATION_CACHE`` at the
session's cache). Tests that move this process's cache put the session's
back (``restore_cache``). Nothing asserts a time: whether the cache was used is
read from the files in it and from JAX's cache-hit events.
"""

import errno
import io
import os
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import config as config_lib
from fedjax_kd import main as main_lib
from fedjax_kd import runner, sweep
from fedjax_kd.core import compiles
from fedjax_kd.errors import ConfigError
from fedjax_kd.running import compile_cache
from fedjax_kd.running import session as session_lib
from tests.shared import tiny_config
from tests.test_main import REPO, read_rows

SMALLEST = ('from tests.shared import tiny_config\n\ndef get_config():\n'
            "  c = tiny_config('single', rounds=1)\n  c.clients.models = ['mlp@0.25']\n  return c\n")


@pytest.fixture
def restore_cache():
  """Puts this process's compilation cache back as it was (the session's) after the test."""
  before = compile_cache.active()
  yield
  compile_cache.enable(before)
  assert compile_cache.active() == before


def _entries(directory) -> set[str]:
  return {n for n in os.listdir(directory) if not n.startswith('.')} if os.path.isdir(
      directory) else set()


# ------------------------------------------------------------ where the cache goes
def test_resolve_takes_the_flag_then_ours_then_jax_then_the_user_cache(tmp_path):
  env = {'HOME': str(tmp_path / 'home')}
  assert compile_cache.resolve(None, env) == (
      os.path.abspath(os.path.join(os.path.expanduser('~'), '.cache/fedjax_kd/jax_cache')),
      'default')
  env['XDG_CACHE_HOME'] = str(tmp_path / 'xdg')
  assert compile_cache.resolve(None, env) == (str(tmp_path / 'xdg/fedjax_kd/jax_cache'),
                                              'default')
  env['JAX_COMPILATION_CACHE_DIR'] = str(tmp_path / 'jax')
  assert compile_cache.resolve(None, env) == (str(tmp_path / 'jax'),
                                              '$JAX_COMPILATION_CACHE_DIR')
  env['FEDJAX_KD_COMPILATION_CACHE'] = str(tmp_path / 'ours')
  assert compile_cache.resolve(None, env) == (str(tmp_path / 'ours'),
                                              '$FEDJAX_KD_COMPILATION_CACHE')
  assert compile_cache.resolve(str(tmp_path / 'flag'), env) == (str(tmp_path / 'flag'),
                                                                '--compilation_cache')
  # '' and none turn it off, whichever says so first; a relative path becomes absolute.
  for off in ('', 'none', 'None', ' NONE '):
    assert compile_cache.resolve(off, env) == (None, '--compilation_cache')
    assert compile_cache.resolve(None, dict(env, FEDJAX_KD_COMPILATION_CACHE=off)) == (
        None, '$FEDJAX_KD_COMPILATION_CACHE')
  assert compile_cache.resolve('rel', {})[0] == os.path.abspath('rel')
  assert compile_cache.resolve('~/c', {})[0] == os.path.expanduser('~/c')


def test_off_words_turn_the_cache_off_and_their_typos_are_refused(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for off in ('off', 'OFF', 'false', 'False', 'no', '0', 'none', ''):
    assert compile_cache.resolve(off, {}) == (None, '--compilation_cache')
  # A bare word close to one of them would have made a folder of that name (once, `off/`):
  # one error naming the flag, the value and the word it resembles.
  for typo, meant in (('of', 'off'), ('offf', 'off'), ('flase', 'false'), ('non', 'none')):
    with pytest.raises(ConfigError, match=rf"--compilation_cache.*{typo!r} looks like a typo "
                                          rf"of {meant!r}"):
      compile_cache.resolve(typo, {})
    with pytest.raises(ConfigError, match='FEDJAX_KD_COMPILATION_CACHE'):
      compile_cache.resolve(None, {'FEDJAX_KD_COMPILATION_CACHE': typo})
  # A path with a separator, or a folder that exists, is taken as written; so is a plain name.
  assert compile_cache.resolve('./of', {})[0] == str(tmp_path / 'of')
  (tmp_path / 'offf').mkdir()
  assert compile_cache.resolve('offf', {})[0] == str(tmp_path / 'offf')
  assert compile_cache.resolve('cache', {})[0] == str(tmp_path / 'cache')
  assert not (tmp_path / 'of').exists()


def test_the_test_session_never_uses_the_home_cache():
  directory, source = compile_cache.resolve()
  assert source == '$FEDJAX_KD_COMPILATION_CACHE'
  assert directory == compile_cache.active()
  assert not directory.startswith(os.path.join(os.path.expanduser('~'), '.cache'))


def test_a_file_is_refused_naming_the_flag_or_the_variable(tmp_path):
  f = tmp_path / 'a_file'
  f.write_text('x')
  with pytest.raises(ConfigError, match=r"^--compilation_cache='.*a_file' is not allowed: "
                                        r'expected a directory .* is a file\)'):
    compile_cache.check(str(f), '--compilation_cache')
  with pytest.raises(ConfigError, match=r'^\$FEDJAX_KD_COMPILATION_CACHE=.*lies under the file'):
    compile_cache.check(str(f / 'sub' / 'dir'), '$FEDJAX_KD_COMPILATION_CACHE')
  compile_cache.check(str(tmp_path / 'new' / 'dir'), '--compilation_cache')   # to be made
  compile_cache.check(str(f), 'default')   # not the user's input: a warning later, if at all
  compile_cache.check(None, '--compilation_cache')


@pytest.mark.parametrize('how', ['flag', 'env'])
def test_the_command_line_refuses_a_file_with_exit_2(tmp_path, capsys, monkeypatch, how):
  def boom(*a, **k):
    raise AssertionError('a bad input reached compute')
  monkeypatch.setattr(session_lib, 'init_state', boom)
  f = tmp_path / 'a_file'
  f.write_text('x')
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(SMALLEST)
  argv = ['fedjax_kd.main', f'--config={cfg}', f'--workdir={tmp_path / "w"}']
  if how == 'flag':
    argv.append(f'--compilation_cache={f}')
  else:
    monkeypatch.setenv('FEDJAX_KD_COMPILATION_CACHE', str(f))
  before = compile_cache.active()
  assert main_lib.cli(argv) == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith('error: ')
  assert ('--compilation_cache=' if how == 'flag' else '$FEDJAX_KD_COMPILATION_CACHE=') in lines[0]
  assert not (tmp_path / 'w').exists() and compile_cache.active() == before


def test_the_sweep_refuses_a_file_with_exit_2(tmp_path, capsys):
  f = tmp_path / 'a_file'
  f.write_text('x')
  out = tmp_path / 'out'
  code = sweep.main([f'--config={REPO}/configs/default.py', f'--out={out}',
                     f'--compilation_cache={f}'])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and '--compilation_cache=' in err[0]
  assert not out.exists()


def test_the_sweep_hands_its_choice_to_the_workers(tmp_path, monkeypatch):
  seen = []

  class FakeWorker:
    """Records the environment it was started with; every run it is asked for fails."""

    def __init__(self, env):
      seen.append(env.get('FEDJAX_KD_COMPILATION_CACHE'))
      self.count, self.err = 0, io.BytesIO()

    def ask(self, rundir):
      del rundir
      self.count += 1
      return {'status': 'failed', 'message': 'not run'}

    def close(self):
      return 0

    retire = close

  monkeypatch.setattr(sweep.workers, 'Worker', FakeWorker)
  runs = sweep.plan(tiny_config('single', rounds=1), [sweep.Variant('single', 'single')], [0], {},
                    str(tmp_path / 'out'))
  for value in (str(tmp_path / 'c'), '', 'none', None):
    assert [r.status for r in sweep.execute(runs, compilation_cache=value, log=None)] == [
        'failed']
  session = os.environ['FEDJAX_KD_COMPILATION_CACHE']   # None: the workers inherit ours
  assert seen == [str(tmp_path / 'c'), 'none', 'none', session]


# ------------------------------------------------------------ turning it on and off
def test_enable_writes_every_program_and_a_new_process_would_load_it(tmp_path, restore_cache):
  d = str(tmp_path / 'cache')
  assert compile_cache.enable(d) == d == compile_cache.active()
  x = np.arange(11, dtype=np.float32)   # a host array: no eager op compiles for it

  def fresh():   # a new function object each time: JAX's in-memory caches cannot serve it
    return jax.jit(lambda v: jnp.sin(v) * 3.0 + 1.0)

  with compiles.time_compiles() as first:
    fresh()(x).block_until_ready()
  assert first.programs == 1 and first.cache_hits == 0
  written = _entries(d)
  assert len(written) == 1        # this tiny program too (JAX alone keeps only >= 1 s ones)
  with compiles.time_compiles() as again:
    fresh()(x).block_until_ready()
  assert again.programs == 1 and again.cache_hits == 1 and _entries(d) == written
  assert again.seconds > 0.0


def test_none_turns_it_off(tmp_path, restore_cache):
  d = str(tmp_path / 'cache')
  compile_cache.enable(d)
  assert compile_cache.setup('none') is None and compile_cache.active() is None
  with compiles.time_compiles() as log:
    jax.jit(lambda v: v * 7.0 - 2.0)(np.ones(5, np.float32)).block_until_ready()
  assert log.programs == 1 and log.cache_hits == 0 and _entries(d) == set()


def _deny(monkeypatch, directory):
  """As a read-only folder looks to its user (root writes anywhere, so it is simulated)."""
  real = tempfile.mkstemp

  def mkstemp(*a, **k):
    if os.path.abspath(str(k.get('dir', ''))) == os.path.abspath(directory):
      raise PermissionError(errno.EACCES, 'Permission denied', directory)
    return real(*a, **k)

  monkeypatch.setattr(compile_cache.tempfile, 'mkstemp', mkstemp)


@pytest.mark.slow
def test_an_unwritable_cache_is_one_warning_and_the_run_goes_on(tmp_path, capsys, monkeypatch,
                                                                restore_cache):
  d = tmp_path / 'ro'
  d.mkdir()
  (d / 'theirs').write_text('not ours')
  _deny(monkeypatch, str(d))
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(SMALLEST)
  code = main_lib.cli(['fedjax_kd.main', f'--config={cfg}', f'--workdir={tmp_path / "w"}',
                       f'--compilation_cache={d}'])
  err = capsys.readouterr().err
  assert code == 0, err
  warnings = [line for line in err.splitlines() if line.startswith('warning')]
  assert warnings == [f'warning: the compilation cache {d} is not writable (Permission denied); '
                      'running without it (set --compilation_cache=DIR or '
                      '$FEDJAX_KD_COMPILATION_CACHE to move it)']
  assert 'round 1: compiling (persistent compilation cache off) ...' in err
  assert 'round    1/1' in err
  assert os.listdir(d) == ['theirs']   # nothing written, nothing removed
  assert compile_cache.active() is None


def test_a_folder_that_cannot_be_made_is_a_warning(tmp_path, capsys):
  f = tmp_path / 'a_file'
  f.write_text('x')
  assert not compile_cache.writable(str(f / 'cache'))
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('warning: the compilation cache ')


# ------------------------------------------------------------ end to end
def _cli(tmp_path, *argv, env=None):
  cfg = tmp_path / 'tiny.py'
  cfg.write_text(SMALLEST)
  env = dict(os.environ, PYTHONPATH=REPO, **(env or {}))
  return subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                         f'--workdir={tmp_path / "w"}', '--noresume', *argv], cwd=REPO,
                        env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_a_first_run_writes_the_cache_and_a_second_loads_everything(tmp_path):
  cache, other = tmp_path / 'cache', tmp_path / 'other'
  cache.mkdir()
  (cache / 'theirs.txt').write_text('a file the project did not write')
  # First run: the cache named by our variable (the flag is absent).
  r = _cli(tmp_path, env={'FEDJAX_KD_COMPILATION_CACHE': str(cache)})
  assert r.returncode == 0, r.stderr
  written = _entries(cache) - {'theirs.txt'}
  assert written, r.stderr
  line = [s for s in r.stderr.splitlines() if s.startswith('round 1: compiled ')]
  assert len(line) == 1 and f'{cache})' in line[0]
  # Second run: the flag beats the variable; every program is loaded, nothing new written.
  r = _cli(tmp_path, f'--compilation_cache={cache}',
           env={'FEDJAX_KD_COMPILATION_CACHE': str(other)})
  assert r.returncode == 0, r.stderr
  assert f'round 1: compiling (persistent cache {cache}) ...' in r.stderr
  line = [s for s in r.stderr.splitlines() if s.startswith('round 1: compiled ')]
  assert len(line) == 1 and line[0].endswith(f'(all from the cache {cache})'), r.stderr
  assert _entries(cache) - {'theirs.txt'} == written
  assert (cache / 'theirs.txt').read_text() == 'a file the project did not write'
  assert not other.exists()
  assert '\r' not in r.stderr
  rows = read_rows(tmp_path / 'w')
  assert rows[0]['compile_s'] > 0.0


# ------------------------------------------------------------ progress lines and ETA
def test_eta_leaves_compilation_out():
  # After round 1 alone: its time less its compile time, times the rounds left.
  assert session_lib.eta_seconds([60.0], [55.0], 29) == pytest.approx(5.0 * 29)
  # Later: the mean of the rounds after the first, less what they compiled (an evaluation
  # round that compiled 0.5 s counts 2.0 s), the first round left out entirely.
  assert session_lib.eta_seconds([60.0, 2.0, 2.5], [55.0, 0.0, 0.5], 10) == pytest.approx(20.0)
  assert session_lib.eta_seconds([60.0, 2.0], [0.0, 0.0], 10) == pytest.approx(20.0)
  assert session_lib.eta_seconds([1.0], [3.0], 5) == 0.0     # compile timed past the wall clock
  assert session_lib.eta_seconds([], [], 5) == 0.0
  assert session_lib.eta_seconds([60.0, 2.0], [55.0, 0.0], 0) == 0.0


def test_compile_progress_prints_whole_lines_at_most_every_interval():
  lines = []
  x = np.arange(5, dtype=np.float32)
  with session_lib._CompileProgress(lines.append, 1, every=0.2) as progress:
    jax.jit(lambda v: jnp.cos(v) + 4.0)(x).block_until_ready()
    time.sleep(0.9)
    progress.done()
    n = len(lines)
    time.sleep(0.3)
  assert len(lines) == n          # done() stopped the ticking
  assert lines[0].startswith('round 1: compiling (')
  assert lines[-1].startswith('round 1: compiled 1 program in ')
  # Between them: "compiling" lines while it compiled, then one "running" line once it had
  # stopped, and nothing more however long the round runs (four ticks here).
  middle = [s.split(' ... ')[0] for s in lines[1:-1]]
  assert middle and middle[-1] == 'round 1: running', lines
  assert ['round 1: running'] * 2 not in [middle[i:i + 2] for i in range(len(middle))], lines
  assert len(middle) <= 3, lines
  assert not any('\r' in s or '\n' in s for s in lines)


@pytest.mark.slow   # over 6 s on one core (docs/testing.md)
def test_the_runner_logs_the_compile_and_writes_compile_s(tmp_path):
  lines = []
  runner.run(config_lib.validate(tiny_config('single', rounds=2)), str(tmp_path), log=lines.append)
  assert lines[0].startswith('fedjax_kd ') and ' | single | 4 clients ' in lines[0], lines[0]
  assert lines[1].startswith('round 1: compiling (persistent cache ')
  assert sum(s.startswith('round 1: compiled ') for s in lines) <= 1   # none if nothing new
  rounds = [s for s in lines if s.startswith('round    ')]
  assert len(rounds) == 2 and all(' eta ' in s for s in rounds)
  rows = read_rows(tmp_path)
  assert all(0.0 <= r['compile_s'] <= r['round_time_s'] for r in rows)


def test_tensorboard_scalars_do_not_import_torch(tmp_path):
  """tensorboardX would import PyTorch (seconds of every start) where it is installed."""
  code = ('import importlib.util, sys\n'
          'from fedjax_kd.running import workdir\n'
          'w = workdir.ScalarWriter(sys.argv[1])\n'
          "w.write({'round': 1, 'test_acc': 0.5})\n"
          'w.close()\n'
          "print('torch' in sys.modules)\n"
          "if importlib.util.find_spec('torch'):\n"
          '  import torch   # still importable afterwards\n'
          '  print(torch.__name__)\n')
  r = subprocess.run([sys.executable, '-c', code, str(tmp_path)], cwd=REPO, capture_output=True,
                     text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
  assert r.returncode == 0, r.stderr
  assert r.stdout.split()[0] == 'False'
  assert [n for n in os.listdir(tmp_path / 'tensorboard') if n.startswith('events.out')]


@pytest.mark.slow   # two pytest sessions in processes of their own
def test_the_test_sessions_cache_is_kept_where_asked_and_a_rerun_finds_its_programs_there(
    tmp_path):
  """``$FEDJAX_KD_TEST_KEEP_CACHE=DIR`` (tests/conftest.py): the session compiles into ``DIR``
  and leaves it; a second session with the same ``DIR`` finds every program it runs there."""
  keep = tmp_path / 'keep'
  test = 'tests/test_compiles.py::test_counter_counts_new_shapes_not_repeats'
  env = {k: v for k, v in os.environ.items()
         if k not in ('FEDJAX_KD_TEST_XLA_CACHE', 'PYTEST_XDIST_WORKER')}
  env['FEDJAX_KD_TEST_KEEP_CACHE'] = str(keep)   # as a developer sets it
  entries = []
  for _ in range(2):
    r = subprocess.run([sys.executable, '-m', 'pytest', test, '-n', '0', '-p', 'no:cacheprovider'],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    entries.append(sorted(n for n in os.listdir(keep) if n.endswith('-cache')))
  # Kept, and the rerun's programs all had their entries there (a key new to the folder would
  # add one: JAX keys on the program, the XLA flags and the versions, not on the session).
  assert entries[0] and entries[1] == entries[0], entries
  assert os.listdir(tmp_path) == ['keep']
