"""A sweep killed with workers in flight, then rerun; a held run directory; a full disk.

The kill tests kill the sweep command for real (SIGKILL of its parent process only, as a job
scheduler does; SIGTERM; SIGINT) while one run is finished and another is between
checkpoints, rerun the same command, and check that nothing was lost or counted twice: the
finished runs are skipped with their files untouched, the interrupted ones resume from their
newest checkpoint, every run's ``metrics.jsonl`` has each round once and equals an
uninterrupted sweep's (timings aside), and the report counts every run once.
"""

import csv
import errno
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from fedjax_kd import sweep
from fedjax_kd.config import presets
from fedjax_kd.errors import DiskFullError
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import planning, workers
from tests import test_faults
from tests.test_sweep import REPO, TINY_SETS, sigint_at_default, sweep_env

# Its long-tier tests time their processes: they run alone (`serial`, tests/conftest.py).

ROUNDS = 8
SEEDS = (0, 1, 2)
NAMES = tuple(f'dsfl/seed{s}' for s in SEEDS)
SETS = [s for s in TINY_SETS if not s.startswith('rounds=')] + [
    f'rounds={ROUNDS}', 'checkpoint.every=1']
CATCH_TIMEOUT_S = 180     # to catch the sweep mid-flight
RUN_TIMEOUT_S = 300       # a whole sweep (or rerun) of these toys


def _argv(out):
  argv = [sys.executable, '-m', 'fedjax_kd.sweep', '--config=configs/default.py',
          '--algorithms=dsfl', '--seeds=' + ','.join(map(str, SEEDS)), '--jobs=2',
          f'--out={out}']
  for s in SETS:
    argv += ['--set', s]
  return argv


def _sweep(out):
  return subprocess.run(_argv(out), cwd=REPO, env=sweep_env(), capture_output=True, text=True,
                        timeout=RUN_TIMEOUT_S)


def _deterministic(rows):
  """A run's rows without the timings (keys ending in ``_s``)."""
  return [{k: v for k, v in r.items() if not k.endswith('_s')} for r in rows]


def _run_dir(out, name):
  return os.path.join(str(out), planning.RUNS_DIR, name)


def _progress(rundir):
  """``(finished, newest checkpoint round or 0)`` of a run directory, as it is now."""
  path = os.path.join(rundir, 'summary.json')
  summary = planning.read_json(path)
  finished = (isinstance(summary, dict) and summary.get('rounds') == ROUNDS
              and not summary.get('stopped_by'))
  ckpts = os.path.join(rundir, 'checkpoints')
  steps = [int(n) for n in os.listdir(ckpts) if n.isdigit()] if os.path.isdir(ckpts) else []
  return finished, max(steps, default=0)


def _files(rundir):
  """``{relative path: (bytes, mtime_ns)}`` of every file under ``rundir``."""
  out = {}
  for root, _, names in os.walk(rundir):
    for n in names:
      path = os.path.join(root, n)
      with open(path, 'rb') as f:
        out[os.path.relpath(path, rundir)] = (f.read(), os.stat(path).st_mtime_ns)
  return out


def _worker_pids(rundir):
  """The pids of the sweep workers that ran ``rundir`` (from its sweep.log)."""
  try:
    with open(os.path.join(rundir, planning.LOG_FILE)) as f:
      lines = f.read().splitlines()
  except OSError:
    return set()
  return {int(line.split()[3]) for line in lines if line.startswith('--- sweep worker ')}


def _alive(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().rsplit(')', 1)[1].split()[0] != 'Z'   # a zombie has ended
  except OSError:
    return True


@pytest.fixture(scope='module')
def reference(tmp_path_factory):
  """The same sweep run uninterrupted: ``{run name: its rows}``."""
  out = tmp_path_factory.mktemp('reference') / 'out'
  proc = _sweep(out)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  return {n: workdir_lib.read_metrics(_run_dir(out, n)) for n in NAMES}


def _start_and_catch(out, log_path):
  """Starts the sweep and returns it once a run is finished and another is in flight.

  Returns:
    ``(process, finished names, {in-flight name: its newest checkpoint's round})`` at the
    moment caught: the in-flight runs have a checkpoint and at least 3 rounds to go.
  """
  log = open(log_path, 'w')   # pylint: disable=consider-using-with
  proc = subprocess.Popen(_argv(out), cwd=REPO, env=sweep_env(), stdout=log,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_at_default)
  log.close()
  deadline = time.monotonic() + CATCH_TIMEOUT_S
  while True:
    progress = {n: _progress(_run_dir(out, n)) for n in NAMES
                if os.path.isdir(_run_dir(out, n))}
    finished = [n for n, (done, _) in progress.items() if done]
    flying = {n: c for n, (done, c) in progress.items() if not done and 1 <= c <= ROUNDS - 3}
    if finished and flying:
      return proc, finished, flying
    if proc.poll() is not None or time.monotonic() > deadline:
      proc.kill()
      proc.wait(timeout=30)
      with open(log_path) as f:
        pytest.fail(f'the sweep was not caught with a run finished and one in flight '
                    f'({progress}); raise ROUNDS. Its output: {f.read()[-2000:]}')
    time.sleep(0.02)


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize('signum', [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=['SIGKILL', 'SIGTERM', 'SIGINT'])
def test_a_killed_sweep_reruns_to_the_uninterrupted_result(tmp_path, reference, signum):
  out = tmp_path / 'out'
  proc, finished, flying = _start_and_catch(out, tmp_path / 'first.log')
  kept = {n: _files(_run_dir(out, n)) for n in finished}
  pids = set().union(*(_worker_pids(_run_dir(out, n)) for n in NAMES))
  os.kill(proc.pid, signum)                 # the sweep's own process, not its workers
  code = proc.wait(timeout=120)
  first = (tmp_path / 'first.log').read_text()
  if signum == signal.SIGKILL:
    assert code == -signal.SIGKILL
  else:                                     # the workers stop after their round, then it exits
    assert code == 128 + signum, first[-3000:]
    assert f'{signal.Signals(signum).name}: the running runs stop after their current round' in (
        first)
    assert not [p for p in pids if _alive(p)]

  # Rerun at once: after SIGKILL, workers may still be finishing their round.
  again = _sweep(out)
  assert again.returncode == 0, again.stdout + again.stderr[-3000:]
  assert 'Traceback' not in again.stdout + again.stderr
  for n in finished:                         # (a) skipped, files untouched
    assert f'skipped  {n}  (finished: {ROUNDS} rounds' in again.stdout
    assert _files(_run_dir(out, n)) == kept[n], n
  for n, ckpt in flying.items():             # (b) resumed from its checkpoint, not round 1
    rundir = _run_dir(out, n)
    log = pathlib.Path(rundir, planning.LOG_FILE).read_text()
    resumed = [int(line.rsplit(' ', 1)[1]) for line in log.splitlines()
               if line.startswith(f'resumed from {rundir}/checkpoints after round ')]
    assert resumed and resumed[-1] >= ckpt, log[-3000:]
    summary = json.loads(pathlib.Path(rundir, 'summary.json').read_text())
    assert summary['rounds_run_this_call'] == ROUNDS - resumed[-1]
    assert not summary.get('stopped_by')
    if signum == signal.SIGKILL:   # the orphaned worker got SIGTERM and stopped after its round
      assert 'SIGTERM: stopping after this round' in log.split('resumed from')[0], log[-3000:]
    # What the rerun prints for it is the row of docs/workdir.md's Faults table.
    template = test_faults._table()['sweep killed with runs in flight']   # pylint: disable=protected-access
    assert any(test_faults._matches(template, line) and f' {n} ' in line  # pylint: disable=protected-access
               for line in again.stdout.splitlines()), again.stdout
  for n in NAMES:                            # (c) each round once, as uninterrupted
    rows = workdir_lib.read_metrics(_run_dir(out, n))
    assert [r['round'] for r in rows] == list(range(1, ROUNDS + 1)), n
    assert _deterministic(rows) == _deterministic(reference[n]), n
  done = sum(f'] done     {n} ' in again.stdout for n in NAMES)       # (d) every run once
  skipped = sum(f'] skipped  {n} ' in again.stdout for n in NAMES)
  assert done + skipped == len(NAMES) and skipped >= len(finished), again.stdout
  assert f'sweep: {done} done, {skipped} skipped, 0 failed' in again.stdout
  with open(out / 'compare.csv') as f:
    rows = list(csv.DictReader(f))
  planned = str(len(SEEDS))
  assert [(r['variant'], r['n'], r['planned']) for r in rows] == [('dsfl', planned, planned)]
  assert not [p for p in pids if _alive(p)]  # no worker outlived its sweep
  assert all(workers.lock_holder(_run_dir(out, n)) is None for n in NAMES)


# ------------------------------------------------------------ a run directory held by another
def _tiny_runs(out, seeds=(0,)):
  runs = sweep.plan(presets.digits(), [sweep.Variant('dsfl', 'dsfl')], seeds, {}, str(out),
                    {'rounds': 3})
  sweep.write_plan(str(out), runs)
  return runs


def _complete(run, acc=0.5):
  """Makes ``run``'s directory look finished (what :func:`sweep.run_state` reads)."""
  os.makedirs(run.workdir, exist_ok=True)
  workdir_lib.write_text(os.path.join(run.workdir, 'config.json'),
                         planning.config_json(run.config))
  rows = [{'round': r, 'test_acc': acc, 'round_bytes': 10, 'cum_bytes': 10 * r,
           'round_time_s': 0.1} for r in range(1, run.rounds + 1)]
  workdir_lib.write_text(os.path.join(run.workdir, workdir_lib.METRICS),
                         ''.join(json.dumps(r) + '\n' for r in rows))
  workdir_lib.write_json(os.path.join(run.workdir, 'summary.json'),
                         {'rounds': run.rounds, 'final_acc': acc})


def test_lock_holder_names_the_live_holder(tmp_path):
  assert workers.lock_holder(str(tmp_path)) is None           # never locked
  with workdir_lib.DirLock(str(tmp_path)):
    holder = workers.lock_holder(str(tmp_path))
    assert holder.startswith(f'pid {os.getpid()} on {socket.gethostname()}, since ')
    assert workers.wait_for_lock(str(tmp_path), 0.1) == holder
  assert workers.lock_holder(str(tmp_path)) is None           # released: free again
  with workdir_lib.DirLock(str(tmp_path)):                    # and the probe left it usable
    pass


def test_a_held_run_dir_is_waited_for_then_named_in_one_line(tmp_path, monkeypatch):
  runs = _tiny_runs(tmp_path)
  monkeypatch.setattr(workers, 'LOCK_WAIT_S', 0.1)
  lines = []
  with workdir_lib.DirLock(runs[0].workdir):   # as a killed sweep's worker would hold it
    holder = workers.lock_holder(runs[0].workdir)
    t0 = time.monotonic()
    (result,) = sweep.execute(runs, jobs=1, log=lines.append)
    waited = time.monotonic() - t0
  assert 0.1 <= waited < 5
  assert holder.startswith(f'pid {os.getpid()} on ')
  assert (result.status, result.message) == ('failed', workers.in_use_message(
      runs[0].workdir, holder, result.wall_s))
  assert result.message == (f'{runs[0].workdir} is in use by another fedjax_kd run ({holder}), '
                            'still after waiting 0 s: let it end (or stop that process), then '
                            'rerun the same command')
  assert lines == [f'[1/1] waiting  dsfl/seed0  (in use by {holder}; waiting up to 0.1 s for '
                   'it to end)',
                   f'[1/1] FAILED   dsfl/seed0  0s  {result.message}']
  assert not os.path.exists(os.path.join(runs[0].workdir, planning.LOG_FILE))   # never started


def test_a_run_finished_by_the_holder_while_waiting_is_skipped(tmp_path, monkeypatch):
  runs = _tiny_runs(tmp_path)
  monkeypatch.setattr(workers, 'LOCK_WAIT_S', 30.0)
  lock = workdir_lib.DirLock(runs[0].workdir)

  def finish_and_release():       # the killed sweep's worker ends the run's last round
    _complete(runs[0])
    lock.release()

  timer = threading.Timer(0.3, finish_and_release)
  lines = []
  timer.start()
  try:
    (result,) = sweep.execute(runs, jobs=1, log=lines.append)
  finally:
    timer.cancel()
    lock.release()
  assert (result.status, result.message) == ('skipped', 'finished: 3 rounds, acc 0.5000')
  assert lines[0].startswith('[1/1] waiting  dsfl/seed0  (in use by pid ')
  assert lines[1].startswith('[1/1] skipped  dsfl/seed0')


def test_a_worker_whose_sweep_is_gone_gets_sigterm(tmp_path):
  """The fallback where prctl is missing (not Linux): the thread that watches the parent.

  A stand-in sweep starts a worker-like process and exits at once (as if killed); the worker,
  handed to another parent, must get SIGTERM (it records it in a file and exits).
  """
  marker = tmp_path / 'got_sigterm'
  worker = ('import os, signal, sys, time\n'
            'from fedjax_kd.sweep import workers\n'
            'workers._parent_death_signal = lambda signum: False\n'
            'workers.PARENT_POLL_S = 0.05\n'
            'def on_term(signum, frame):\n'
            f'  open({str(marker)!r}, "w").write("SIGTERM")\n'
            '  os._exit(0)\n'
            'signal.signal(signal.SIGTERM, on_term)\n'
            'workers._follow_parent()\n'
            'time.sleep(60)\n')
  sweep_ = ('import os, subprocess, sys\n'
            f'env = dict(os.environ, {workers.PARENT_ENV}=str(os.getpid()))\n'
            f'subprocess.Popen([sys.executable, "-c", {worker!r}], env=env)\n')
  proc = subprocess.run([sys.executable, '-c', sweep_], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  deadline = time.monotonic() + 60
  while not marker.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert marker.read_text() == 'SIGTERM'


def test_a_worker_whose_node_daemon_is_gone_gets_sigterm(tmp_path):
  """A worker-like process follows a stand-in node daemon (a sleep, by its pid and start
  time, NODE_ENV); killing the daemon gets it SIGTERM, which stops a run after its round."""
  daemon = subprocess.Popen(['sleep', '60'])
  marker = tmp_path / 'got_sigterm'
  try:
    token = workers.process_token(daemon.pid)
    assert token and workers.token_alive(token)
    pid, start = token.split()
    assert not workers.token_alive(f'{pid} {int(start) + 1}')   # another process, same pid
    worker = ('import os, signal, sys, time\n'
              'from fedjax_kd.sweep import workers\n'
              'workers.PARENT_POLL_S = 0.05\n'
              'def on_term(signum, frame):\n'
              f'  open({str(marker)!r}, "w").write("SIGTERM")\n'
              '  os._exit(0)\n'
              'signal.signal(signal.SIGTERM, on_term)\n'
              'workers._follow_node()\n'
              'print("following", flush=True)\n'
              'time.sleep(60)\n')
    proc = subprocess.Popen([sys.executable, '-c', worker], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, **{workers.NODE_ENV: token}))
    assert proc.stdout.readline().strip() == 'following'
    time.sleep(0.3)
    assert not marker.exists()   # the daemon lives: nothing happens
    daemon.kill()
    daemon.wait()
    assert proc.wait(timeout=30) == 0
    assert marker.read_text() == 'SIGTERM'
    assert "the node's daemon (pid " in proc.stderr.read()
  finally:
    daemon.kill()
  assert workers.process_token(daemon.pid) is None and not workers.token_alive(token)


def test_a_slurm_task_records_its_address_on_the_route_to_its_controller():
  assert workers.route_address('127.0.0.1:6817') == '127.0.0.1'
  assert workers.route_address('not an address') is None


# ------------------------------------------------------------ a full disk
def _enospc(*_):
  raise OSError(errno.ENOSPC, 'No space left on device')


def _full_after(prefix, module, monkeypatch):
  """Files whose name starts with ``prefix`` fail half-way through their write (ENOSPC)."""
  real_open = open

  class HalfFile:
    def __init__(self, f):
      self.f = f

    def write(self, data):
      self.f.write(data[:len(data) // 2])
      self.f.flush()
      _enospc()

    def __getattr__(self, name):
      return getattr(self.f, name)

    def __enter__(self):
      return self

    def __exit__(self, *exc):
      self.f.close()

  def opener(path, *args, **kw):
    f = real_open(path, *args, **kw)
    return HalfFile(f) if os.path.basename(str(path)).startswith(prefix) else f

  monkeypatch.setattr(module, 'open', opener, raising=False)


def _disk_full_line(path, err):
  lines = [x for x in err.splitlines() if x.strip()]
  assert len(lines) == 1, err
  assert lines[0].startswith(f'error: no space left to write {path} ('), lines[0]
  assert lines[0].endswith(' free on its device): free some space or move the workdir to a '
                           'larger disk, then rerun the same command to resume from the '
                           'newest checkpoint'), lines[0]


@pytest.mark.slow
@pytest.mark.serial
def test_the_sweep_outputs_on_a_full_disk_are_one_line_and_intact(tmp_path, monkeypatch,
                                                                   capsys):
  out = tmp_path / 'out'
  runs = _tiny_runs(out, seeds=(0, 1))
  for r, acc in zip(runs, (0.4, 0.6)):
    _complete(r, acc)
  argv = ['--config=configs/default.py', '--algorithms=dsfl', '--seeds=0,1', f'--out={out}',
          '--set', 'rounds=3']
  monkeypatch.chdir(REPO)
  assert sweep.main(argv) == 0
  capsys.readouterr()
  names = ('compare.csv', 'compare.md', 'accuracy_test_acc.png', 'sweep.json')
  before = {n: (out / n).read_bytes() for n in names}
  for prefix, module, first in (('compare.', workdir_lib, 'compare.csv'),
                                ('accuracy_', workdir_lib, 'accuracy_test_acc.png')):
    with monkeypatch.context() as m:
      _full_after(prefix, module, m)
      assert sweep.main(argv) == 2
    _disk_full_line(out / first, capsys.readouterr().err)
    assert {n: (out / n).read_bytes() for n in names} == before   # nothing half written
    assert not [n for n in os.listdir(out) if n.endswith('.tmp')]
  # A finished run's metrics damaged by hand: one line naming the file, exit 2.
  metrics = os.path.join(runs[0].workdir, workdir_lib.METRICS)
  with open(metrics) as f:
    lines = f.read().splitlines(keepends=True)
  with open(metrics, 'w') as f:
    f.writelines([lines[0], '{"round": 2, oops\n'] + lines[2:])
  assert sweep.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f'error: {metrics}: line 2 is not valid JSON (Expecting property name enclosed '
                 'in double quotes: line 1 column 14 (char 13)).'], err
  # The plan is the sweep's first write: a full disk stops it before any run starts.
  monkeypatch.setattr(workdir_lib.os, 'fsync', _enospc)
  assert sweep.main(argv[:-3] + [f'--out={tmp_path / "new"}']) == 2
  _disk_full_line(tmp_path / 'new' / 'sweep.json', capsys.readouterr().err)
  assert os.listdir(tmp_path / 'new') == []


def test_write_outputs_raises_disk_full_naming_the_file(tmp_path, monkeypatch):
  out = tmp_path / 'out'
  runs = _tiny_runs(out)
  _complete(runs[0])
  cells = sweep.aggregate(str(out))
  monkeypatch.setattr(workdir_lib.os, 'fsync', _enospc)
  with pytest.raises(DiskFullError) as e:
    sweep.write_outputs(str(out), cells)
  assert e.value.path == str(out / 'compare.csv')
  assert not (out / 'compare.csv').exists() and not (out / 'compare.csv.tmp').exists()
  with pytest.raises(DiskFullError) as e:
    workdir_lib.write_bytes(str(out / 'x.png'), b'png')
  assert e.value.path == str(out / 'x.png')
  assert sorted(os.listdir(out)) == ['runs', 'sweep.json']


def test_a_run_that_meets_a_full_disk_says_so_and_stops_new_runs(tmp_path, monkeypatch):
  """The worker's answer marks a full disk, so the sweep starts no further runs."""
  from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
  run = _tiny_runs(tmp_path / 'out')[0]
  os.makedirs(run.workdir, exist_ok=True)
  workdir_lib.write_json(os.path.join(run.workdir, planning.RUN_FILE),
                         {'config': json.loads(planning.config_json(run.config))})

  def full(*_, **__):
    raise DiskFullError(os.path.join(run.workdir, 'metrics.jsonl'))

  monkeypatch.setattr(runner, 'run', full)
  lines = []
  answer = workers.run_one(run.workdir, lines.append)
  assert answer['status'] == 'failed' and answer['code'] == 2 and answer['disk_full']
  assert answer['message'].startswith(f'error: no space left to write {run.workdir}/metrics.jsonl')
