"""A lost process of a multi-process run: the others stop, one line, exit code 4; a rerun resumes.

The end-to-end test runs two CPU processes on localhost (jax.distributed, gloo, as
tests/test_multihost.py), kills one with SIGKILL in the middle of the run, checks what the
survivor does (its exit code, its one line, how long it took), reruns the same command on
both processes, and so on: process 1 first, then process 0 (the coordinator). The resumed
run's rows must equal those of an uninterrupted run. The other tests drive the watchdog's
decisions in-process with a stand-in for the coordination service's key-value store.
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from fedjax_kd.running import watchdog as watchdog_lib
from tests import test_faults

# The end-to-end test times its processes, so it runs alone (`serial`, tests/conftest.py); the
# watchdog's in-process tests wait on threads that beat every 10 ms against a 1 s timeout, which
# a busy neighbour does not move.

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = ('from tests.shared import tiny_config\n\ndef get_config():\n  c = tiny_config(rounds=8)\n'
          '  c.checkpoint.every = 2\n  return c\n')
# From the kill to the survivor's exit: JAX's heartbeat timeout, plus slack for a loaded machine.
BOUND_S = watchdog_lib.HEARTBEAT_TIMEOUT_S + 10
START_S = 300     # the most a launch may take to reach a round (compiling on a busy machine)
RERUN = (r'rerun the same command on every process to resume from the newest checkpoint '
         r'\(round (\d+)\)')


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


class _Job:
  """The two processes of one launch, their output in files (``<name>.<i>.out/err``)."""

  def __init__(self, tmp, name, cfg, workdir, port):
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu',
               XLA_FLAGS='--xla_force_host_platform_device_count=1')
    env.pop('TF_CPP_MIN_LOG_LEVEL', None)   # the run's own default: the C++ log silenced
    self.err = [tmp / f'{name}.{i}.err' for i in range(2)]
    self.procs = []
    for i in range(2):
      with open(tmp / f'{name}.{i}.out', 'w') as out, open(self.err[i], 'w') as err:
        self.procs.append(subprocess.Popen(
            [sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}', f'--workdir={workdir}',
             '--noprogress', f'--coordinator_address=127.0.0.1:{port}', '--num_processes=2',
             f'--process_id={i}'], cwd=REPO, env=env, stdout=out, stderr=err))

  def stderr(self, i) -> str:
    return self.err[i].read_text()

  def wait_for_round(self, workdir, t):
    """Returns once ``metrics.jsonl`` has a row of round ``t`` or later; fails if a process
    ends first or it takes over START_S."""
    path = os.path.join(workdir, 'metrics.jsonl')
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
      for i, p in enumerate(self.procs):
        assert p.poll() is None, f'process {i} ended with {p.returncode}:\n{self.stderr(i)[-3000:]}'
      if os.path.exists(path):
        with open(path) as f:
          rounds = [json.loads(line)['round'] for line in f if line.endswith('\n')]
        if rounds and rounds[-1] >= t:
          return
      time.sleep(0.05)
    pytest.fail(f'no round {t} within {START_S} s')

  def kill_and_time(self, victim) -> tuple[int, float]:
    """SIGKILLs process ``victim``; returns the survivor's exit code and seconds to exit."""
    self.procs[victim].send_signal(signal.SIGKILL)
    t0 = time.monotonic()
    survivor = self.procs[1 - victim]
    try:
      rc = survivor.wait(timeout=BOUND_S + 30)
    except subprocess.TimeoutExpired:
      pytest.fail(f'process {1 - victim} still running {BOUND_S + 30} s after process '
                  f'{victim} was killed:\n{self.stderr(1 - victim)[-3000:]}')
    elapsed = time.monotonic() - t0
    self.procs[victim].wait(timeout=30)
    return rc, elapsed

  def finish(self, timeout=START_S):
    for i, p in enumerate(self.procs):
      try:
        p.wait(timeout=timeout)
      except subprocess.TimeoutExpired:
        pytest.fail(f'process {i} still running after {timeout} s:\n{self.stderr(i)[-3000:]}')
      assert p.returncode == 0, f'process {i} exited {p.returncode}:\n{self.stderr(i)[-3000:]}'

  def kill(self):
    for p in self.procs:
      if p.poll() is None:
        p.kill()
        p.wait(timeout=30)


def _rows(workdir):
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    return [json.loads(line) for line in f]


def _computed(row):
  """A row without its timings (keys ending in ``_s``)."""
  return {k: v for k, v in row.items() if not k.endswith('_s')}


def _assert_newest(m, workdir, t) -> int:
  """The line's round (``m[1]``) is ``t`` or later and its checkpoint (``m[2]``) the newest in
  ``workdir``, or the one before it where the kill came while the lost round's checkpoint was
  being saved (the survivor had not seen that save complete). Returns the newest."""
  names = os.listdir(os.path.join(workdir, 'checkpoints'))
  newest = max(int(n) for n in names if n.isdigit())
  lost, named = int(m[1]), int(m[2])
  assert lost >= t and newest >= t - 2, (m[0], names)
  assert named == newest or (newest == lost and named == lost - 2), (m[0], names)
  return newest


@pytest.mark.slow
@pytest.mark.serial
def test_a_lost_process_stops_the_others_and_every_process_reruns_to_resume(tmp_path):
  cfg = tmp_path / 'cfg.py'
  cfg.write_text(CONFIG)
  jobs = []
  try:
    # The uninterrupted run, for the rows: one process with the same two-device mesh (its
    # rows equal those of two processes, tests/test_multihost.py), which is quicker.
    ref = tmp_path / 'ref'
    r = subprocess.run([sys.executable, '-m', 'fedjax_kd.main', f'--config={cfg}',
                        f'--workdir={ref}', '--noprogress'], cwd=REPO, capture_output=True,
                       text=True, timeout=START_S, env=dict(
                           os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu',
                           XLA_FLAGS='--xla_force_host_platform_device_count=2'))
    assert r.returncode == 0, r.stderr[-3000:]

    run, port = tmp_path / 'run', _free_port()
    # 1. Process 1 is killed in round 4 (round 3's row is written, checkpoint 2 saved).
    jobs.append(_Job(tmp_path, 'first', cfg, run, port))
    jobs[-1].wait_for_round(run, 3)
    rc, elapsed = jobs[-1].kill_and_time(victim=1)
    err = jobs[-1].stderr(0)
    assert rc == watchdog_lib.EXIT_LOST, err
    assert elapsed < BOUND_S, (elapsed, err)
    assert len(err.splitlines()) == 1, err   # one line: no traceback, no C++ log
    m = re.fullmatch(r'error: process 1 of 2 stopped responding at round (\d+); ' + RERUN + '\n',
                     err)
    assert m, err
    newest = _assert_newest(m, run, 4)
    print(f'process 1 killed: process 0 exited {rc} after {elapsed:.2f} s: {err.strip()}')

    # 2. The same command on both processes resumes; now process 0 (the coordinator) is killed.
    jobs.append(_Job(tmp_path, 'second', cfg, run, port))
    jobs[-1].wait_for_round(run, 5)
    rc, elapsed = jobs[-1].kill_and_time(victim=0)
    resumed = jobs[-1].stderr(0)
    assert f'after round {newest}' in resumed and 'resumed from' in resumed, resumed
    err = jobs[-1].stderr(1)
    assert rc == watchdog_lib.EXIT_LOST, err
    assert elapsed < BOUND_S, (elapsed, err)
    assert len(err.splitlines()) == 1, err
    m = re.fullmatch(r'error: process 0 of 2 \(the coordinator, 127\.0\.0\.1:' + str(port)
                     + r'\) stopped responding at round (\d+); ' + RERUN + '\n', err)
    assert m, err
    assert test_faults._matches(  # pylint: disable=protected-access
        test_faults._table()['coordinator lost in a multi-process run'], err.strip())  # pylint: disable=protected-access
    newest = _assert_newest(m, run, 6)
    print(f'process 0 killed: process 1 exited {rc} after {elapsed:.2f} s: {err.strip()}')

    # 3. The same command again finishes the run; its rows are the uninterrupted run's.
    jobs.append(_Job(tmp_path, 'third', cfg, run, port))
    jobs[-1].finish()
    assert f'after round {newest}' in jobs[-1].stderr(0), jobs[-1].stderr(0)
    got, want = _rows(run), _rows(ref)
    assert [r['round'] for r in got] == [r['round'] for r in want] == list(range(1, 9))
    assert [_computed(r) for r in got] == [_computed(r) for r in want]
  finally:
    for job in jobs:
      job.kill()


# ------------------------------------------------------------ the watchdog, in-process
class _Store:
  """Stands in for the coordination service's key-value store (the part the watchdog uses)."""

  def __init__(self):
    self.kv = {}
    self.down = False

  def key_value_set(self, key, value, allow_overwrite=False):
    if self.down:
      raise RuntimeError('UNAVAILABLE: Socket closed')
    assert allow_overwrite or key not in self.kv
    self.kv[key] = value

  def key_value_dir_get(self, key):
    if self.down:
      raise RuntimeError('UNAVAILABLE: Socket closed')
    return sorted((k, v) for k, v in self.kv.items() if k.startswith(key))


class _Exit(BaseException):
  pass


@pytest.fixture
def watchdog(monkeypatch):
  """A watchdog of process 1 of 3 on a :class:`_Store`, beating every 10 ms; ``os._exit``
  raises :class:`_Exit` (its code in ``args[0]``) and the lines written are kept."""
  monkeypatch.setattr(watchdog_lib, 'BEAT_S', 0.01)
  lines = []
  monkeypatch.setattr(watchdog_lib, '_write_line', lines.append)

  def fake_exit(code):
    raise _Exit(code)

  monkeypatch.setattr(watchdog_lib.os, '_exit', fake_exit)
  store = _Store()
  # The coordinator's address: a port nothing listens on (closed at once), for the probe.
  w = watchdog_lib._Watchdog(  # pylint: disable=protected-access
      store, 1, 3, f'127.0.0.1:{_free_port()}', timeout=1)
  w.store, w.lines = store, lines
  return w


def _beat(w, **counters):
  for name, value in counters.items():
    w.store.kv[f'fedjax_kd/beat/{name[1:]}'] = str(value)
  w.read(w.store.key_value_dir_get('fedjax_kd/'))


def test_the_line_names_the_silent_process_the_round_and_the_checkpoint(watchdog):
  w = watchdog
  w.round, w.saved = 7, 6
  _beat(w, p0=1, p2=1)
  time.sleep(0.05)
  _beat(w, p0=2)           # process 0 moves on, process 2 stays silent
  w.coordinator = None     # no probe: process 0 answered above
  assert w.line(aborting=False) == (
      'error: process 2 of 3 stopped responding at round 7; rerun the same command on every '
      'process to resume from the newest checkpoint (round 6)')
  assert test_faults._matches(  # pylint: disable=protected-access
      test_faults._table()['process lost in a multi-process run'], w.line(aborting=False))  # pylint: disable=protected-access


def test_an_unreachable_coordinator_is_named(watchdog):
  w = watchdog
  w.round, w.saved = 3, None
  _beat(w, p0=1, p2=1)
  with pytest.raises(_Exit) as e:
    w.end(force=True)    # the runtime aborts this process: nothing listens at process 0
  assert e.value.args == (watchdog_lib.EXIT_LOST,)
  assert w.lines == [f'error: process 0 of 3 (the coordinator, {w.coordinator}) stopped '
                     'responding at round 3; rerun the same command on every process to start '
                     'over (no checkpoint was saved)']


@contextlib.contextmanager
def _beating(w, *processes):
  """Processes ``processes`` beat every 10 ms (their counters in ``w``'s store) while inside."""
  stop = threading.Event()

  def beat():
    k = 5
    while not stop.wait(0.01):
      k += 1
      for p in processes:
        w.store.kv[f'fedjax_kd/beat/{p}'] = str(k)

  t = threading.Thread(target=beat, daemon=True)
  t.start()
  try:
    yield
  finally:
    stop.set()
    t.join()


def test_settle_returns_once_every_other_process_is_alive(watchdog):
  w = watchdog
  w.coordinator = None
  _beat(w, p0=5, p2=5)
  w.start()
  try:
    with _beating(w, 0, 2):      # both others keep beating
      t0 = time.monotonic()
      w.settle(own_error=False)   # returns: the error is this process's own
      assert time.monotonic() - t0 < 1 and not w.lines
  finally:
    w.stop()


def test_settle_ends_the_process_naming_a_peer_that_exited_with_an_error(watchdog):
  w = watchdog
  w.round, w.saved = 4, 2
  _beat(w, p0=1, p2=1)
  w.store.kv['fedjax_kd/exit/2'] = '2'
  _beat(w, p0=2)
  with pytest.raises(_Exit) as e:
    w.settle(own_error=False)   # a failed collective, because process 2 exited
  assert e.value.args == (watchdog_lib.EXIT_LOST,)
  assert w.lines == ['error: process 2 of 3 exited with code 2 at round 4 (its own output says '
                     'why); rerun the same command on every process to resume from the newest '
                     'checkpoint (round 2)']


def test_settle_ends_the_process_naming_a_peer_that_stopped(watchdog):
  w = watchdog
  w.coordinator = None
  _beat(w, p0=1, p2=1)
  w.start()   # process 2 never beats again; process 0 does, below
  try:
    with _beating(w, 0), pytest.raises(_Exit):
      w.settle(own_error=True)   # waits at most the heartbeat timeout (1 s here)
  finally:
    w.stop()
  assert len(w.lines) == 1 and w.lines[0].startswith(
      'error: process 2 of 3 stopped responding while starting; rerun the same command on '
      'every process to resume from the newest checkpoint, if the run saved one'), w.lines


def test_an_abort_while_joining_says_who_waited_where(watchdog, monkeypatch):
  del watchdog   # for its stand-ins of os._exit and the line
  monkeypatch.setattr(watchdog_lib, '_joining', ('10.0.0.1:1234', 4, 3))
  lines = []
  monkeypatch.setattr(watchdog_lib, '_write_line', lines.append)
  with pytest.raises(_Exit):
    watchdog_lib._on_abort(signal.SIGABRT)  # pylint: disable=protected-access
  assert lines[0] == (f'error: process 3 of 4 gave up after {watchdog_lib.JOIN_TIMEOUT_S} s '
                      'waiting for every process to join at 10.0.0.1:1234; start the same '
                      'command on every process, each with its own --process_id, within that '
                      'time')


def test_heartbeat_timeout_from_the_environment(monkeypatch):
  from fedjax_kd.errors import ConfigError
  monkeypatch.delenv(watchdog_lib.HEARTBEAT_ENV, raising=False)
  assert watchdog_lib.heartbeat_timeout() == watchdog_lib.HEARTBEAT_TIMEOUT_S
  monkeypatch.setenv(watchdog_lib.HEARTBEAT_ENV, '30')
  assert watchdog_lib.heartbeat_timeout() == 30
  for bad in ('1', 'ten'):
    monkeypatch.setenv(watchdog_lib.HEARTBEAT_ENV, bad)
    with pytest.raises(ConfigError, match=watchdog_lib.HEARTBEAT_ENV):
      watchdog_lib.heartbeat_timeout()


def test_single_process_run_settles_at_once():
  # Nothing started outside jax.distributed.
  assert watchdog_lib._watchdog is None  # pylint: disable=protected-access
  t0 = time.monotonic()
  watchdog_lib.settle(RuntimeError('a bug'))
  watchdog_lib.exiting(1)
  watchdog_lib.note_round(3, 2)
  assert time.monotonic() - t0 < 0.1
