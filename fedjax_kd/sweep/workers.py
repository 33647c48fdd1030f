"""Running a sweep's runs: worker processes, resume and skip, progress, stop signals.

Part of :mod:`fedjax_kd.sweep`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Iterator, Sequence


from fedjax_kd import config as config_lib
from fedjax_kd.errors import ConfigError, DataError, DiskFullError, DivergenceError
from fedjax_kd.running import compile_cache
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep.executor_options import Executor
from fedjax_kd.sweep.planning import (
    ATTEMPTS_FILE, DIVERGED_FILE, LOG_FILE, RUNS_DIR, RUN_FILE, Run, config_json, jsonable,
    load_run_config, read_json, read_json_lines, run_file)

RUNS_PER_WORKER = 20              # a worker process is replaced after this many runs
# A run whose directory another process still holds (e.g. a worker of a killed sweep finishing
# its round) is waited for this long, then reported as failed (the rerun goes on).
LOCK_WAIT_S = 120.0
LOCK_POLL_S = 0.2
# The sweep's pid, in its workers' environment: a worker stops when its sweep is gone.
PARENT_ENV = 'FEDJAX_KD_SWEEP_PARENT'
PARENT_POLL_S = 1.0
# Where a worker runs, as a JSON object the executor that started it sets (a Ray node, a
# SLURM array task); each run's ATTEMPTS_FILE records it with the host and pid.
WHERE_ENV = 'FEDJAX_KD_SWEEP_WHERE'
# The daemon of the node a worker runs on (a Ray node's raylet), as "PID START" (its start
# time, so that a new process given the same pid is not taken for it): a worker whose node is
# gone stops after its current round (:func:`_follow_node`), checked every PARENT_POLL_S.
NODE_ENV = 'FEDJAX_KD_SWEEP_NODE'
_PR_SET_PDEATHSIG = 1             # <linux/prctl.h>


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What became of a run.

  Attributes:
    run: the :class:`Run`.
    status: ``'done'``, ``'skipped'`` (already finished), ``'diverged'`` (a
      round left NaN or Inf: the run stopped there, now or in an earlier call),
      ``'failed'`` or ``'stopped'`` (SIGINT/SIGTERM; resumable).
    wall_s: seconds it took in this call.
    message: the error, or a short note (e.g. the final accuracy).
    summary: the run's ``summary.json`` content when there is one.
  """
  run: Run
  status: str
  wall_s: float = 0.0
  message: str = ''
  summary: dict[str, Any] | None = None

  @classmethod
  def of(cls, run: Run, answer: dict[str, Any], wall: float = 0.0) -> 'RunResult':
    """The result a worker's answer (:func:`run_one`) gives; ``wall`` where it has none."""
    return cls(run, answer['status'], answer.get('wall_s', wall), answer.get('message', ''),
               answer.get('summary'))


# ------------------------------------------------------------ run state
def read_diverged(workdir: str) -> dict[str, Any] | None:
  """The run's divergence record (``{'round', 'message'}``), or None if it has none."""
  doc = read_json(os.path.join(workdir, DIVERGED_FILE))
  return doc if isinstance(doc, dict) else None


def diverged_lines(cells: Sequence[dict[str, Any]]) -> list[str]:
  """``'<label>: seed s at round r, ...'`` for each cell with diverged seeds."""
  return [f'{c["label"]}: ' + ', '.join(f'seed {s} at round {r}'
                                         for s, r in sorted(c['diverged'].items()))
          for c in cells if c.get('diverged')]


def run_state(run: Run) -> tuple[str, str]:
  """Whether ``run`` has to be started, resumed or skipped.

  Returns:
    ``(state, note)``: ``'new'`` (nothing there), ``'partial'`` (resume from
    the newest checkpoint, if any), ``'complete'`` (its ``summary.json`` has
    the planned rounds and no ``stopped_by``), ``'diverged'`` (an earlier call
    stopped at a non-finite round: :data:`DIVERGED_FILE`) or ``'stale'`` (the workdir
    holds a run of a different config, or of more rounds: it is left alone
    and the note names a differing field).
  """
  from fedjax_kd.running import session as session_lib  # pylint: disable=g-import-not-at-top
  summary = read_json(os.path.join(run.workdir, 'summary.json'))
  old = read_json(os.path.join(run.workdir, 'config.json'))
  if old is not None:
    new = json.loads(config_json(run.config))
    a, b = session_lib.resumable(old), session_lib.resumable(new)
    if a != b:
      diff = _first_difference(a, b)
      return 'stale', (f'{run.workdir} holds a run of a different config ({diff}); delete it '
                       'or use another --out')
  diverged = read_diverged(run.workdir)
  if old is not None and diverged is not None:
    return 'diverged', (f'diverged at round {diverged.get("round")} in an earlier call; delete '
                        f'{os.path.join(run.workdir, DIVERGED_FILE)} to try again')
  ckpts = os.path.join(run.workdir, 'checkpoints')
  resumable = os.path.isdir(ckpts) and any(n.isdigit() for n in os.listdir(ckpts))
  if summary is None or not os.path.exists(os.path.join(run.workdir, workdir_lib.METRICS)):
    if old is None:
      return 'new', ''
    return 'partial', 'resuming from its checkpoint' if resumable else 'starting over'
  done = int(summary.get('rounds') or 0)
  if summary.get('stopped_by') or done < run.rounds:
    return 'partial', f'resuming after round {done}'
  if done > run.rounds:
    return 'stale', (f'{run.workdir} ran {done} rounds, the plan asks for {run.rounds}; delete '
                     'it or use another --out')
  acc = summary.get('final_acc')
  return 'complete', f'finished: {done} rounds' + (f', acc {acc:.4f}' if results.finite(acc) else '')


def settled(run: Run, state: str, note: str) -> RunResult | None:
  """The result of a run that :func:`run_state` says not to run; None if it has to run."""
  if state == 'complete':
    return RunResult(run, 'skipped', 0.0, note,
                     read_json(os.path.join(run.workdir, 'summary.json')))
  if state == 'diverged':
    return RunResult(run, 'diverged', 0.0, note)
  if state == 'stale':
    return RunResult(run, 'failed', 0.0, note)
  return None


def lock_holder(rundir: str) -> str | None:
  """Who holds ``rundir``'s run lock (:class:`fedjax_kd.running.workdir.DirLock`), if anyone.

  The lock is probed with a shared ``flock`` that is dropped at once, so a free directory
  stays free. Without ``fcntl`` (not POSIX) nothing can be told: None.

  Returns:
    ``'pid P on HOST, since TIME'`` (``'another process'`` when its record is
    unreadable) while a live process holds the lock; None when it is free.
  """
  try:
    import fcntl  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  try:
    fd = os.open(os.path.join(rundir, workdir_lib.LOCK), os.O_RDONLY)
  except OSError:
    return None           # no lock file: no run ever held the directory
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
      try:
        h = json.loads(os.pread(fd, 4096, 0).decode(errors='replace'))
        return f'pid {h["pid"]} on {h["host"]}, since {h["since"]}'
      except (OSError, ValueError, KeyError, TypeError):
        return 'another process'
    fcntl.flock(fd, fcntl.LOCK_UN)
    return None
  finally:
    os.close(fd)


def wait_for_lock(rundir: str, timeout: float, stop: threading.Event | None = None
                  ) -> str | None:
  """Waits up to ``timeout`` seconds (or until ``stop`` is set) for ``rundir`` to be free.

  Returns:
    None once it is free, else the holder (:func:`lock_holder`).
  """
  deadline = time.monotonic() + timeout
  holder = lock_holder(rundir)
  while holder is not None and time.monotonic() < deadline:
    if stop is None:
      time.sleep(LOCK_POLL_S)
    elif stop.wait(LOCK_POLL_S):
      break
    holder = lock_holder(rundir)
  return holder


def await_free(run: Run, stop: threading.Event | None = None,
               on_wait: Callable[[str], None] | None = None) -> RunResult | None:
  """Waits (:func:`wait_for_lock`) while another process holds ``run``'s directory (e.g. a
  killed sweep's worker, or one on a lost node, finishing its round).

  Args:
    run: the run about to start.
    stop: set to give up waiting (the caller checks it).
    on_wait: told the holder once, when there is one to wait for.

  Returns:
    None when the run is free to start; else its result: ``'failed'`` (still held: the
    line of :func:`in_use_message`) or what that process left it (:func:`settled`).
  """
  holder = lock_holder(run.workdir)
  if holder is None:
    return None
  if on_wait is not None:
    on_wait(holder)
  t0 = time.monotonic()
  holder = wait_for_lock(run.workdir, LOCK_WAIT_S, stop)
  if holder is not None:
    waited = time.monotonic() - t0
    return RunResult(run, 'failed', waited, in_use_message(run.workdir, holder, waited))
  state, note = run_state(run)   # that process may have finished it
  return settled(run, state, note)


def in_use_message(rundir: str, holder: str, waited: float) -> str:
  """The one line for a run directory that stayed locked by another process."""
  return (f'{rundir} is in use by another fedjax_kd run ({holder}), still after waiting '
          f'{waited:.0f} s: let it end (or stop that process), then rerun the same command')


def _first_difference(a: Any, b: Any, prefix: str = '') -> str:
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if a.get(k) != b.get(k):
        return _first_difference(a.get(k), b.get(k), f'{prefix}{k}.')
  return f'{prefix.rstrip(".")}: {a!r} there, {b!r} now'


# ------------------------------------------------------------ execution
class StopRequested(Exception):
  """SIGTERM in the sweep's process: stop like Ctrl-C (:func:`terminate_as_stop`)."""


@contextlib.contextmanager
def terminate_as_stop() -> Iterator[None]:
  """Within it, SIGTERM raises :class:`StopRequested` in the main thread (elsewhere: no
  change), so that a sweep stops the same way for SIGTERM as for Ctrl-C."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def on_term(signum, frame):
    del signum, frame
    raise StopRequested

  old = signal.signal(signal.SIGTERM, on_term)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, old)


def _worker_command() -> list[str]:
  return [sys.executable, '-m', 'fedjax_kd.sweep', '--_worker=-']


class Worker:
  """A worker process: takes run directories on stdin, answers a JSON line each."""

  def __init__(self, env: dict[str, str]):
    # Output outside a run (imports, a crash between runs) goes to a temporary
    # file; during a run the worker sends it to the run's sweep.log.
    self.err = tempfile.TemporaryFile()
    # Its own session: a terminal's Ctrl-C reaches only the parent, which
    # forwards exactly one SIGINT (a second one would abort the round).
    self.proc = subprocess.Popen(_worker_command(), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.err, env=env,
                                 text=True, bufsize=1, start_new_session=True)
    self.count = 0

  def stderr_tail(self, chars: int = 600) -> str:
    """The end of what the worker wrote outside runs (one line)."""
    try:
      self.err.seek(0)
      text = self.err.read().decode(errors='replace')
    except (OSError, ValueError):
      return ''
    return ' '.join(text.split())[-chars:]

  def ask(self, rundir: str) -> dict[str, Any] | None:
    """Runs one run; None when the worker died."""
    self.count += 1
    try:
      self.proc.stdin.write(json.dumps({'rundir': rundir}) + '\n')
      self.proc.stdin.flush()
      line = self.proc.stdout.readline()
    except (BrokenPipeError, OSError, ValueError):
      line = ''
    if not line:
      return None
    try:
      return json.loads(line)
    except ValueError:
      return None

  def signal(self, signum: int) -> None:
    if self.proc.poll() is None:
      try:
        os.kill(self.proc.pid, signum)
      except OSError:
        pass

  def close(self) -> int:
    """Ends the worker (it exits when its stdin closes); returns its exit status."""
    try:
      self.proc.stdin.close()
    except OSError:
      pass
    try:
      code = self.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      code = self.proc.wait()
    return code

  def retire(self) -> int:
    """:meth:`close`, and its output file with it (read :meth:`stderr_tail` before)."""
    code = self.close()
    self.err.close()
    return code


def _schedule(pending: list[tuple[int, Run, str]]) -> list[tuple[int, Run, str]]:
  """The order runs start in: seed-major, and within a seed one run per algorithm first.

  Every variant's first seed runs before any second seed, and the first run
  of each algorithm before the second run of any, so that workers running at
  the same time mostly compile different programs and later runs find theirs
  in the persistent compilation cache.
  """
  seed_rank = {s: k for k, s in enumerate(dict.fromkeys(r.seed for _, r, _ in pending))}
  seen: dict[tuple[int, str], int] = {}
  keyed = []
  for item in pending:
    i, run, _ = item
    k = (run.seed, run.variant.algorithm)
    seen[k] = seen.get(k, -1) + 1
    keyed.append(((seed_rank[run.seed], seen[k], i), item))
  return [item for _, item in sorted(keyed, key=lambda kv: kv[0])]


def _display_names(runs: Sequence[Run]) -> list[str]:
  """Each run's workdir below the runs' common directory, without ``/runs/``."""
  if not runs:
    return []
  dirs = [os.path.abspath(r.workdir) for r in runs]
  root = os.path.commonpath(dirs) if len(dirs) > 1 else os.path.dirname(dirs[0])
  out = []
  for r, d in zip(runs, dirs):
    rel = os.path.relpath(d, root).replace(os.sep, '/')
    out.append(rel.replace(f'/{RUNS_DIR}/', '/') if rel.count('/') > 1 else r.name)
  return out


class Ledger:
  """A sweep's outcome so far and its progress lines, one per run started, finished,
  skipped or failed (``[i/n] word  name  ...``); shared by every executor."""

  def __init__(self, runs: Sequence[Run], log: Callable[[str], None] | None):
    self.runs, self.log = list(runs), log or (lambda s: None)
    self.names = _display_names(self.runs)
    self.width = len(str(len(self.runs)))
    self.outcome: dict[int, RunResult] = {}
    self.interrupts = 0   # SIGINT/SIGTERM that reached the sweep so far

  def line(self, i: int, word: str, text: str) -> None:
    self.log(f'[{i + 1:>{self.width}}/{len(self.runs)}] {word:<8} {self.names[i]}{text}')

  def started(self, i: int, note: str = '') -> None:
    self.line(i, 'start', f'  ({note})' if note else '')

  def waiting(self, i: int, holder: str) -> None:
    self.line(i, 'waiting', f'  (in use by {holder}; waiting up to {LOCK_WAIT_S:g} s for it '
                             'to end)')

  def ended(self, i: int, result: RunResult) -> None:
    self.outcome[i] = result
    word = {'failed': 'FAILED', 'diverged': 'DIVERGED'}.get(result.status, result.status)
    msg = f'  {result.message}' if result.message else ''
    self.line(i, word, f'  {results.fmt_time(result.wall_s)}{msg}')

  def interrupted(self, e: BaseException) -> int:
    """Counts a Ctrl-C (KeyboardInterrupt) or SIGTERM (:class:`StopRequested`) and says what
    the sweep does about it; returns the signal, for the running runs."""
    self.interrupts += 1
    signum = signal.SIGTERM if isinstance(e, StopRequested) else signal.SIGINT
    again = '' if self.interrupts == 1 else ' (again: aborting them)'
    self.log(f'{signal.Signals(signum).name}: the running runs stop after their current round '
             f'and save a checkpoint{again}')
    return signum

  def results(self) -> list[RunResult]:
    """A :class:`RunResult` per run in the order of the runs (``'stopped'``, ``'not
    started'`` for a run that never ended)."""
    return [self.outcome.get(i) or RunResult(run, 'stopped', 0.0, 'not started')
            for i, run in enumerate(self.runs)]


def prepare(ledger: Ledger) -> list[tuple[int, Run, str]]:
  """Settles the runs that need not run (finished, diverged, stale: their lines are logged)
  and writes each other run's ``sweep_run.json``.

  Returns:
    ``(index, run, note)`` of every run to start or resume, in the order they start
    (:func:`_schedule`).
  """
  pending = []
  for i, run in enumerate(ledger.runs):
    state, note = run_state(run)
    done = settled(run, state, note)
    if done is not None:
      ledger.outcome[i] = done
      if done.status == 'failed':
        ledger.line(i, 'FAILED', f'  {note}')
      else:
        ledger.line(i, done.status, f'  ({note})')
    else:
      os.makedirs(run.workdir, exist_ok=True)
      workdir_lib.write_json(os.path.join(run.workdir, RUN_FILE), run_file(run), indent=2)
      pending.append((i, run, note))
  return _schedule(pending)


def worker_env(compilation_cache: str | None, base: dict[str, str] | None = None
               ) -> dict[str, str]:
  """The environment of a worker process: ``base`` (default: this process's), with the
  compilation cache the sweep chose (None: the worker chooses as ``fedjax_kd.main``
  does) and without a parent to follow (the process that starts the worker sets it)."""
  env = dict(os.environ if base is None else base)
  env.pop(PARENT_ENV, None)
  if compilation_cache is not None:   # the workers' compile_cache.resolve() reads it first
    off = compilation_cache.strip().lower() in compile_cache.OFF
    env[compile_cache.ENV_VAR] = 'none' if off else os.path.abspath(compilation_cache)
  return env


def end_of(run: Run, answer: dict[str, Any] | None, wall: float, worker: 'Worker',
           stopping: bool) -> RunResult:
  """The :class:`RunResult` of a worker's answer (None: the worker died; ``stopping``: the
  sweep was being stopped, so a dead worker means a stopped run, not a failed one)."""
  if answer is not None:
    return RunResult.of(run, answer, wall)
  code = worker.close()
  tail = worker.stderr_tail()
  return RunResult(run, 'stopped' if stopping else 'failed', wall,
                   f'the worker process exited with status {code}; see '
                   f'{os.path.join(run.workdir, LOG_FILE)}' + (f'; it wrote: {tail}' if tail else ''))


def execute(runs: Sequence[Run], jobs: int = 1, log: Callable[[str], None] | None = print,
            compilation_cache: str | None = None) -> list[RunResult]:
  """Runs every run that is not finished yet, up to ``jobs`` worker processes at once.

  Finished runs are skipped, interrupted ones resumed from their newest
  checkpoint (:func:`run_state`). Each run's config goes to
  ``<workdir>/sweep_run.json`` and its output to ``<workdir>/sweep.log``.
  SIGINT/SIGTERM stop the running runs after their current round (they save
  a checkpoint) and start no new ones; a second Ctrl-C aborts them at once. If this
  process is killed outright, its workers get SIGTERM (:func:`_follow_parent`). A run
  whose directory another process holds (a killed sweep's worker finishing its round) is
  waited for up to :data:`LOCK_WAIT_S` seconds, then skipped if that process finished it,
  run if not, and reported as failed (:func:`in_use_message`) if it is still held.
  This is the ``local`` executor; :mod:`fedjax_kd.sweep.executors` has the others.

  Args:
    runs: from :func:`plan`.
    jobs: worker processes at once (>= 1).
    log: where the progress lines go (one per run started, finished,
      skipped or failed); None for silence.
    compilation_cache: the workers' JAX persistent compilation cache directory
      (one of ``compile_cache.OFF``: no cache); None lets each worker choose as
      ``fedjax_kd.main`` does (:func:`fedjax_kd.running.compile_cache.resolve`).

  Returns:
    A :class:`RunResult` per run, in the order of ``runs``.
  """
  jobs = max(1, int(jobs))
  ledger = Ledger(runs, log)
  pending = prepare(ledger)
  todo: queue.Queue = queue.Queue()
  for item in pending:
    todo.put(item)
  if todo.empty():
    return ledger.results()

  env = worker_env(compilation_cache)
  env[PARENT_ENV] = str(os.getpid())
  stop = threading.Event()
  events: queue.Queue = queue.Queue()
  lock = threading.Lock()
  workers: list[Worker] = []

  def slot():
    worker = None
    try:
      while not stop.is_set():
        try:
          i, run, note = todo.get_nowait()
        except queue.Empty:
          break
        done = await_free(run, stop, lambda h, i=i: events.put(('wait', i, h, None)))
        if stop.is_set():
          break
        if done is not None:
          events.put(('end', i, done, None))
          continue
        if worker is not None and worker.count >= RUNS_PER_WORKER:
          worker.retire()
          worker = None
        if worker is None:
          worker = Worker(env)
          with lock:
            workers.append(worker)
        if stop.is_set():   # stopped while the worker started: leave the run for a rerun
          break
        events.put(('start', i, run, note))
        t0 = time.time()
        answer = worker.ask(os.path.abspath(run.workdir))
        wall = time.time() - t0
        result = end_of(run, answer, wall, worker, stop.is_set())
        if answer is None:
          worker.err.close()
          worker = None
        else:
          if answer['status'] == 'stopped':
            stop.set()
          if answer.get('disk_full'):   # the next runs would fail the same way: start none
            stop.set()
            events.put(('full', i, None, None))
        events.put(('end', i, result, None))
    finally:
      try:
        if worker is not None:
          worker.retire()
      finally:   # whatever failed above, the sweep hears that this slot is done
        events.put(('exit', None, None, None))

  threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(jobs, todo.qsize()))]
  for t in threads:
    t.start()
  live = len(threads)
  with terminate_as_stop():
    while live:
      try:
        try:
          kind, i, obj, note = events.get(timeout=0.5)
        except queue.Empty:
          continue
        if kind == 'exit':
          live -= 1
        elif kind == 'start':
          ledger.started(i, note)
        elif kind == 'full':
          ledger.log(f'{ledger.names[i]} met a full disk: no new runs start; free some space, '
                     'then rerun the same command')
        elif kind == 'wait':
          ledger.waiting(i, obj)
        else:
          ledger.ended(i, obj)
      except (KeyboardInterrupt, StopRequested) as e:
        signum = ledger.interrupted(e)
        stop.set()
        with lock:
          for w in workers:
            w.signal(signum)
  return ledger.results()


def record_attempt(rundir: str) -> dict[str, Any]:
  """Appends where this process runs ``rundir`` to its :data:`ATTEMPTS_FILE`: the host, the
  pid, the time, and what the executor that started it put in :data:`WHERE_ENV` (a JSON
  object, e.g. a Ray node's id and address, or a SLURM array task and its controller, whose
  route gives the node's address, ``ip``). A file the disk cannot take is skipped: the run
  itself then reports the full disk.

  Returns:
    The record.
  """
  try:
    where = json.loads(os.environ.get(WHERE_ENV) or '{}')
  except ValueError:
    where = {}
  record = {'executor': 'local', **(where if isinstance(where, dict) else {}),
            'host': socket.gethostname(), 'pid': os.getpid(),
            'started': time.strftime('%Y-%m-%dT%H:%M:%S')}
  if 'ip' not in record and record.get('controller'):
    ip = route_address(str(record['controller']))
    if ip:
      record['ip'] = ip
  try:
    with open(os.path.join(rundir, ATTEMPTS_FILE), 'a') as f:
      f.write(json.dumps(record) + '\n')
  except OSError:
    pass
  return record


def route_address(peer: str) -> str | None:
  """This machine's address on its route to ``peer`` (``HOST:PORT``, e.g. a SLURM
  controller): where the cluster reaches this node. A UDP socket's ``connect`` sends nothing;
  None where there is no route."""
  host, _, port = peer.rpartition(':')
  try:
    family = socket.AF_INET6 if ':' in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
      s.connect((host.strip('[]'), int(port)))
      return s.getsockname()[0]
  except (OSError, ValueError):
    return None


def attempts(rundir: str) -> list[dict[str, Any]]:
  """The records of :func:`record_attempt` for ``rundir``, oldest first."""
  return read_json_lines(os.path.join(rundir, ATTEMPTS_FILE))


def run_one(rundir: str, log: Callable[[str], None]) -> dict[str, Any]:
  """Runs (or resumes) the run in ``rundir``; the answer a worker sends back.

  Returns:
    ``{'status', 'code', 'message', 'wall_s', 'summary'}``: ``status`` is
    ``'done'``, ``'diverged'`` (also written to :data:`DIVERGED_FILE`),
    ``'failed'`` or ``'stopped'``; ``code`` is what
    ``fedjax_kd.main`` would exit with (0, 2 bad config or data, 3
    divergence, 1 any other error, 128 + signal when stopped).
  """
  from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
  t0 = time.time()
  resumed = []

  def runner_log(s: str) -> None:
    if s.startswith('resumed from'):
      resumed.append(s)
    log(s)

  record_attempt(rundir)
  spec = None
  try:
    spec = config_lib.validate(load_run_config(rundir))
    summary = runner.run(spec, rundir, resume=True, progress=False, log=runner_log)
  except (ConfigError, DataError) as e:
    log(f'error: {e}')
    return {'status': 'failed', 'code': 2, 'message': f'error: {e}', 'wall_s': time.time() - t0,
            'disk_full': isinstance(e, DiskFullError)}
  except DivergenceError as e:
    log(f'error: {e}')
    workdir_lib.write_json(os.path.join(rundir, DIVERGED_FILE),
                           {'round': e.round, 'message': str(e)[:2000]}, indent=2)
    return {'status': 'diverged', 'code': 3, 'message': f'round {e.round}: {str(e)[:300]}',
            'wall_s': time.time() - t0}
  except KeyboardInterrupt:
    # A signal can land after the run wrote its last round and summary (while the runner
    # lets go of the workdir): a finished run's files are then left exactly as they are.
    summary = workdir_lib.read_json(rundir, 'summary.json')
    finished = (spec is not None and isinstance(summary, dict)
                and not summary.get('stopped_by') and summary.get('rounds') == spec.rounds)
    if not finished:
      log('interrupted; a rerun resumes from the newest checkpoint, if there is one')
    return {'status': 'stopped', 'code': 130, 'message': 'interrupted',
            'wall_s': time.time() - t0}
  except Exception as e:  # pylint: disable=broad-except
    log(traceback.format_exc())
    return {'status': 'failed', 'code': 1,
            'message': f'{type(e).__name__}: {str(e)[:300]} (traceback in '
                       f'{os.path.join(rundir, LOG_FILE)})', 'wall_s': time.time() - t0}
  wall = time.time() - t0
  if summary.get('stopped_by'):
    return {'status': 'stopped', 'code': 128 + signal.Signals[summary['stopped_by']].value,
            'message': f'stopped by {summary["stopped_by"]} after round {summary["rounds"]}',
            'wall_s': wall, 'summary': summary}
  acc = summary.get('final_acc')
  msg = (f'acc {acc:.4f}' if results.finite(acc) else 'acc -') + (
      f'  (resumed after round {summary["rounds"] - summary["rounds_run_this_call"]})'
      if resumed else '')
  return {'status': 'done', 'code': 0, 'message': msg, 'wall_s': wall, 'summary': summary}


def quiet_logs() -> None:
  """Only warnings from JAX, absl and orbax (orbax logs every save at INFO)."""
  import logging  # pylint: disable=g-import-not-at-top

  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)   # orbax logs every save at INFO


def _follow_parent() -> None:
  """Makes this worker stop when the sweep that started it is gone, however it ended.

  A sweep killed outright (SIGKILL: a job scheduler, an out-of-memory killer) cannot stop
  its workers, and they run in their own session, so nothing else reaches them. Each then
  gets SIGTERM, the signal the sweep itself would have forwarded: a run stops after its
  current round and saves a checkpoint (a worker between runs or still setting one up just
  exits), so it soon frees the run directory for a rerun. On Linux the kernel sends it
  (``prctl(PR_SET_PDEATHSIG)``); elsewhere, or should that fail, a thread checks every
  :data:`PARENT_POLL_S` seconds whether the worker was handed to another parent. Without
  :data:`PARENT_ENV` (a worker started by hand) nothing is done.
  """
  try:
    parent = int(os.environ.pop(PARENT_ENV))
  except (KeyError, ValueError):
    return
  if _parent_death_signal(signal.SIGTERM):
    if os.getppid() != parent:     # the sweep died before the kernel was told
      os.kill(os.getpid(), signal.SIGTERM)
    return

  def watch():
    while os.getppid() == parent:
      time.sleep(PARENT_POLL_S)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, daemon=True, name='fedjax_kd-sweep-parent').start()


def process_token(pid: int) -> str | None:
  """``'PID START'`` for a live process (its start time from ``/proc``), else None: what
  :data:`NODE_ENV` holds, and :func:`token_alive` checks."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rsplit(')', 1)[1].split()
  except (OSError, IndexError):
    return None
  # Field 22 of stat, the start time; fields[0] here is field 3 (the state).
  return f'{pid} {fields[19]}' if len(fields) > 19 and fields[0] not in 'ZX' else None


def token_alive(token: str) -> bool:
  """Whether the process of a :func:`process_token` still runs (not a zombie, not another
  process with its pid)."""
  try:
    return process_token(int(token.split()[0])) == token
  except (ValueError, IndexError):
    return False


def _follow_node() -> None:
  """Makes this worker stop, after its current round with a checkpoint, once the daemon of
  its node (:data:`NODE_ENV`) is gone.

  A Ray node whose raylet dies is lost to its cluster, which retries the run on another
  node; the run's process here must not play on beside the retry. It gets SIGTERM, as from a
  sweep that stops it: the round ends, the checkpoint is saved, the run directory is let go,
  and the retry (waiting for its lock) resumes from there. Without :data:`NODE_ENV` nothing
  is done.
  """
  token = os.environ.pop(NODE_ENV, '')
  if not token:
    return

  def watch():
    while token_alive(token):
      time.sleep(PARENT_POLL_S)
    print(f'the node\'s daemon (pid {token.split()[0]}) is gone: the run stops after its '
          'current round and saves a checkpoint', file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

  threading.Thread(target=watch, daemon=True, name='fedjax_kd-sweep-node').start()


def _parent_death_signal(signum: int) -> bool:
  """Asks Linux to send ``signum`` when the parent thread ends; False where it cannot."""
  if not sys.platform.startswith('linux'):
    return False
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
  except (OSError, AttributeError, TypeError):
    return False


def _hear_stop_signals() -> None:
  """SIGINT and SIGTERM reach this worker, whatever the process that started it did with
  them: a Ray worker blocks and ignores SIGINT, and its children inherit both (a blocked
  signal across exec, an ignored one too), so the stop a sweep forwards would never
  arrive. Here they are unblocked, and SIGINT is Python's KeyboardInterrupt again."""
  stops = {signal.SIGINT, signal.SIGTERM}
  if hasattr(signal, 'pthread_sigmask'):
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _answer(fd: int, answer: dict[str, Any]) -> bool:
  """Writes one JSON line to the sweep; False when it is gone (the pipe is closed)."""
  data = memoryview((json.dumps(answer, default=jsonable) + '\n').encode())
  try:
    while data:
      data = data[os.write(fd, data):]
  except OSError:   # BrokenPipeError: the sweep was killed; the run's files say it all
    return False
  return True


def worker_main(target: str) -> int:
  """The hidden ``--_worker`` entry point.

  Args:
    target: a run directory (run it, print to the terminal, exit like
      ``fedjax_kd.main``), or ``-``: read run directories from stdin, one a
      line (JSON ``{"rundir": ...}`` or a bare path), run each with its output
      in ``<rundir>/sweep.log``, and answer each with one JSON line on stdout.

  Returns:
    The exit status.
  """
  _hear_stop_signals()
  if target == '-':
    _follow_parent()
    _follow_node()
  quiet_logs()
  # Where the sweep chose the cache, $FEDJAX_KD_COMPILATION_CACHE says so (execute()).
  compile_cache.enable(compile_cache.resolve()[0])
  if target != '-':
    def say(s):
      print(s, file=sys.stderr, flush=True)
    return int(run_one(target, say)['code'])
  proto = os.dup(1)                 # answers go out with os.write: nothing left buffered
  os.dup2(2, 1)                     # stray prints must not reach the answers
  home_err = os.dup(2)
  code = 0
  try:
    for line in sys.stdin:
      line = line.strip()
      if not line:
        continue
      rundir = json.loads(line)['rundir'] if line.startswith('{') else line
      with open(os.path.join(rundir, LOG_FILE), 'a') as f:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
          print(f'--- sweep worker {os.getpid()} at {time.strftime("%Y-%m-%d %H:%M:%S")}',
                file=sys.stderr, flush=True)
          answer = run_one(rundir, lambda s: print(s, file=sys.stderr, flush=True))
        finally:
          sys.stdout.flush()
          sys.stderr.flush()
          os.dup2(home_err, 1)
          os.dup2(home_err, 2)
      if not _answer(proto, answer):
        code = int(answer['code'])
        break
      if answer['status'] == 'stopped':
        code = int(answer['code'])
        break
  except KeyboardInterrupt:
    code = 130
  return code


def stopped_status(outcome: Sequence[RunResult]) -> int:
  """128 + the signal that stopped the sweep: 143 for SIGTERM, else 130 (SIGINT)."""
  term = any((r.summary or {}).get('stopped_by') == 'SIGTERM' for r in outcome)
  return 128 + (signal.SIGTERM if term else signal.SIGINT).value


class Local(Executor):
  """The ``local`` executor: :func:`execute`'s worker processes on this machine."""
  name = 'local'
  help = 'worker processes here, --jobs at once'

  def execute(self, runs, options, *, jobs, log, compilation_cache, home):
    del options, home   # no settings of its own; its files are the runs'
    return execute(runs, jobs=jobs, log=log, compilation_cache=compilation_cache)
