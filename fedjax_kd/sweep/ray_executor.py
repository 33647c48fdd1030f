"""The ``ray`` executor: a sweep's runs as Ray tasks on an existing cluster.

Part of :mod:`fedjax_kd.sweep` (:mod:`~fedjax_kd.sweep.executors` chooses it). Each run is
one task holding ``--run_resources`` (default one CPU); on the node Ray picks, the task starts
the worker process every executor uses (``python -m fedjax_kd.sweep --_worker=-``), hands it
the run's directory and returns its answer. Ray decides how many run at once: as many as the
cluster's resources hold.

* **Shared storage first.** Before anything runs, this process writes a file beside the
  workdirs and a task on every live node reads it back; a node that cannot is one line
  (:func:`~fedjax_kd.sweep.executor_options.storage_error`) and nothing starts.
* **Joining.** The head is asked first (:func:`head_answers`, at most
  :data:`CONNECT_TIMEOUT_S`): an address where no Ray head answers is one line in seconds,
  not Ray's minutes of retries, and Ctrl-C while joining starts nothing.
* **A node lost.** Ray retries a task whose node or worker died (:data:`RETRIES` times) on
  another node; the run resumes there from its newest checkpoint, after waiting for the
  lost process's lock on the directory to go (:func:`~fedjax_kd.sweep.workers.await_free`).
  A run whose node's raylet alone died does not play on beside its retry: its worker
  follows the raylet and stops after its round (:data:`~fedjax_kd.sweep.workers.NODE_ENV`).
  Each try appends its node to the run's ``sweep_attempts.jsonl``.
* **Ray's own output** (its warnings, a lost node's log lines, its retries) goes to
  ``ray.log`` in the sweep's folder, not between the progress lines.
* **Ctrl-C / SIGTERM.** Tasks not yet started are cancelled; the running runs are told
  through a file in their directory (:data:`~fedjax_kd.sweep.planning.STOP_FILE`, which a
  task watches), stop after their current round with a checkpoint, and answer; a second
  Ctrl-C aborts them.

Every node needs fedjax_kd and Ray installed in the Python it runs tasks with, and the
sweep's folder (and a ``--config`` file) at the same path.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.sweep import executor_options
from fedjax_kd.sweep.planning import STOP_FILE, Run
from fedjax_kd.sweep.workers import (
    NODE_ENV, PARENT_ENV, RUNS_PER_WORKER, WHERE_ENV, Ledger, RunResult, StopRequested, Worker,
    attempts, await_free, prepare, process_token, terminate_as_stop, token_alive, worker_env)

RETRIES = 3            # tries of a run after the first, where its node or worker died
POLL_S = 0.5           # how often the driver looks for ended and started runs
PROBE_TIMEOUT_S = 120  # how long a node may take to answer the shared-storage check
CONNECT_TIMEOUT_S = 5.0  # how long the head may take to answer before the sweep gives up
RAY_LOG = 'ray.log'    # in the sweep's folder: what Ray itself writes in this process


def import_ray() -> Any:
  """Ray, or the one line saying how to install it."""
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError('--executor', 'ray', "Ray installed: pip install 'fedjax_kd[ray]' (on "
                      'this machine and every node)') from None
  return ray


def connect(ray: Any, address: str) -> None:
  """Connects this process to the cluster at ``address``, unless it already is.

  The head is asked first, in at most :data:`CONNECT_TIMEOUT_S` (:func:`head_answers`): Ray's
  own connect retries for minutes where nothing answers.

  Raises:
    DataError: no cluster answers there (Ray never starts one here).
  """
  if ray.is_initialized():
    return
  first_line = lambda e: (str(e).strip().splitlines() or [type(e).__name__])[0]
  target = address
  resolve = getattr(getattr(getattr(ray, '_private', None), 'services', None),
                    'canonicalize_bootstrap_address_or_die', None)
  if resolve is not None:   # the HOST:PORT Ray itself would use ('auto': as 'ray start' left)
    try:
      target = resolve(address)
    except (ConnectionError, RuntimeError, ValueError) as e:
      raise no_cluster(address, first_line(e)) from None
  why = head_answers(target)
  if why:
    raise no_cluster(address, why if target == address else f'{target}: {why}')
  try:
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
  except (ConnectionError, RuntimeError, ValueError) as e:
    raise no_cluster(address, first_line(e)) from None


def no_cluster(address: str, why: str) -> DataError:
  """The one line for a ``--ray_address`` where no Ray cluster answers, and why not."""
  return DataError(f'--executor=ray: no Ray cluster at --ray_address={address} ({why}); start '
                   "one with 'ray start --head', or give its head's HOST:PORT (docs/cluster.md)")


# What an HTTP/2 client sends first: the connection preface and an empty SETTINGS frame
# (RFC 9113, 3.4). A Ray head's GCS is a gRPC server, so it answers with a SETTINGS frame.
HTTP2_PREFACE = b'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n' + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4   # the frame type, the fourth byte of a frame's header


def head_answers(address: str, timeout: float | None = None) -> str | None:
  """Whether a Ray head answers at ``address`` (``HOST:PORT``) within ``timeout`` seconds
  (default :data:`CONNECT_TIMEOUT_S`): it takes the connection and answers an HTTP/2
  preface, as its gRPC server does. A wait that Ctrl-C ends (KeyboardInterrupt).

  Returns:
    None when it answers (or cannot be asked this way: a cluster with TLS), else why not.
  """
  timeout = CONNECT_TIMEOUT_S if timeout is None else timeout
  if os.environ.get('RAY_USE_TLS', '0').strip().lower() in ('1', 'true'):
    return None
  host, _, port = address.rpartition(':')
  late = f'no answer in {timeout:g} s'
  try:
    sock = socket.create_connection((host.strip('[]'), int(port)), timeout=timeout)
  except ConnectionRefusedError:
    return 'nothing listens there'
  except socket.timeout:
    return late
  except (OSError, ValueError) as e:
    return getattr(e, 'strerror', None) or str(e) or type(e).__name__
  with sock:
    head = b''
    try:
      sock.sendall(HTTP2_PREFACE)
      deadline = time.monotonic() + timeout
      while len(head) < 9:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        chunk = sock.recv(9 - len(head))
        if not chunk:
          break
        head += chunk
    except socket.timeout:
      return late
    except OSError as e:
      return e.strerror or type(e).__name__
  if len(head) < 9 or head[3] != _SETTINGS:
    return 'what answers there does not speak gRPC, as a Ray head does'
  return None


def _probe(path: str) -> tuple[str, str]:
  import ray  # pylint: disable=g-import-not-at-top
  return ray.get_runtime_context().get_node_id(), executor_options.read_probe(path)


def check_storage(ray: Any, folder: str) -> int:
  """Every live node reads back a file this process writes in ``folder``.

  Returns:
    The number of nodes checked.

  Raises:
    DataError: a node read something else, or did not answer in :data:`PROBE_TIMEOUT_S`.
  """
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # pylint: disable=g-import-not-at-top
  nodes = [n for n in ray.nodes() if n.get('Alive')]
  path, token = executor_options.write_probe(folder)
  try:
    probe = ray.remote(num_cpus=0, max_retries=0)(_probe)
    refs = {probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        n['NodeID'], soft=False)).remote(path): n for n in nodes}
    ready, late = ray.wait(list(refs), num_returns=len(refs), timeout=PROBE_TIMEOUT_S)
    name = lambda n: f'node {n["NodeID"][:12]} ({n["NodeManagerAddress"]})'
    lost = (ray.exceptions.NodeDiedError, ray.exceptions.TaskUnschedulableError,
            ray.exceptions.WorkerCrashedError)
    for ref in ready:
      try:
        _, got = ray.get(ref)
      except lost:   # the node died since it was listed: Ray schedules nothing there
        continue
      except Exception as e:  # pylint: disable=broad-except
        got = f'its task failed: {type(e).__name__}'
      if got != token:
        raise executor_options.storage_error('ray', name(refs[ref]), path, got)
    for ref in late:
      raise executor_options.storage_error('ray', name(refs[ref]), path,
                                    f'nothing in {PROBE_TIMEOUT_S} s')
  finally:
    try:
      os.remove(path)
    except OSError:
      pass
  return len(nodes)


FORWARDED = ('XLA_FLAGS', 'JAX_', 'FEDJAX_KD_')   # the prefixes of what a run gets from here


def forwarded_env() -> dict[str, str]:
  """The variables of this process every run gets on its node (:data:`FORWARDED`): what sets
  XLA's and JAX's behaviour and fedjax_kd's, as the local executor's workers inherit them and
  sbatch exports them. The rest (``CUDA_VISIBLE_DEVICES``: Ray sets it for a task's GPUs;
  ``PATH``) comes from the node's own environment."""
  return {k: v for k, v in os.environ.items() if k.startswith(FORWARDED)}


def stop_level(rundir: str) -> int:
  """0, or 1 (stop after the round) or 2 (abort) as the driver wrote in :data:`STOP_FILE`."""
  try:
    with open(os.path.join(rundir, STOP_FILE)) as f:
      return 2 if f.read().strip() == 'abort' else 1
  except OSError:
    return 0


def run_task(run: Run, env: dict[str, str]) -> dict[str, Any]:
  """A run's Ray task: the worker process on this node, its answer, where it ran.

  Args:
    run: the run (its directory on shared storage).
    env: what the worker's environment gets beyond this node's (the compilation cache).

  Returns:
    The worker's answer (:func:`~fedjax_kd.sweep.workers.run_one`) and ``'where'``.
  """
  import ray  # pylint: disable=g-import-not-at-top
  where = {'executor': 'ray', 'node': ray.get_runtime_context().get_node_id(),
           'ip': ray.util.get_node_ip_address()}
  rundir = os.path.abspath(run.workdir)
  t0 = time.time()
  if stop_level(rundir):
    return {'status': 'stopped', 'message': 'not started', 'wall_s': 0.0, 'where': where}
  stop = threading.Event()
  watching = threading.Event()

  def watch():
    while not watching.wait(POLL_S):
      if stop_level(rundir):
        stop.set()
        return

  threading.Thread(target=watch, daemon=True).start()
  try:
    done = await_free(run, stop)
    if stop.is_set():
      return {'status': 'stopped', 'message': 'not started', 'wall_s': 0.0, 'where': where}
    if done is not None:
      return {'status': done.status, 'message': done.message, 'wall_s': done.wall_s,
              'summary': done.summary, 'where': where}
  finally:
    watching.set()
  node = node_daemon()
  worker = _kept_worker({**worker_env(None), **env, WHERE_ENV: json.dumps(where),
                         PARENT_ENV: str(os.getpid()), **({NODE_ENV: node} if node else {})})
  box: dict[str, Any] = {}
  asker = threading.Thread(target=lambda: box.update(answer=worker.ask(rundir)), daemon=True)
  asker.start()
  sent = 0
  while asker.is_alive():
    try:
      asker.join(POLL_S)
      level = stop_level(rundir)
    except KeyboardInterrupt:   # ray.cancel: stop as the driver's stop file would
      level = max(sent + 1, 1)
    while sent < min(level, 2):
      worker.signal(signal.SIGINT)
      sent += 1
  answer = box.get('answer')
  if answer is None:
    tail = worker.stderr_tail()
    code = _let_go(worker)
    answer = {'status': 'stopped' if sent else 'failed', 'wall_s': time.time() - t0,
              'message': f'the worker process exited with status {code} on node '
                         f'{where["node"][:12]} ({where["ip"]})' + (f'; it wrote: {tail}'
                                                                     if tail else '')}
  elif answer['status'] == 'stopped' or worker.count >= RUNS_PER_WORKER:
    _let_go(worker)
  if answer['status'] == 'stopped' and node and not token_alive(node):
    # The node is gone and its run stopped for that: this answer must not stand for the run.
    # A task whose worker dies is one Ray retries on a live node, which resumes the run.
    os._exit(1)
  answer['where'] = where
  return answer


def node_daemon() -> str | None:
  """The :func:`~fedjax_kd.sweep.workers.process_token` of this Ray worker's raylet (Ray
  starts its worker processes as the raylet's children), for the run's worker to follow
  (:data:`~fedjax_kd.sweep.workers.NODE_ENV`); None where the parent is not a raylet."""
  parent = os.getppid()
  try:
    with open(f'/proc/{parent}/comm') as f:
      if f.read().strip() != 'raylet':
        return None
  except OSError:
    return None
  return process_token(parent)


# The worker process a Ray worker process keeps between its tasks (Ray reuses its worker
# processes for the tasks of one job): each run after the first then skips Python's and JAX's
# start, as the local executor's workers do. It goes with its Ray worker (the parent it
# follows), and is replaced when the environment a run asks for differs.
_KEPT: dict[str, Any] = {}


def _kept_worker(env: dict[str, str]) -> Worker:
  key = json.dumps(env, sort_keys=True)
  worker = _KEPT.get('worker')
  if worker is not None and (_KEPT.get('key') != key or worker.proc.poll() is not None):
    _let_go(worker)
    worker = None
  if worker is None:
    worker = Worker(env)
    _KEPT.update(worker=worker, key=key)
  return worker


def _let_go(worker: Worker) -> int:
  """Ends ``worker`` (it exits once its stdin closes) and forgets it; its exit status."""
  if _KEPT.get('worker') is worker:
    _KEPT.clear()
  return worker.retire()


def execute(runs: Sequence[Run], options: executor_options.ExecutorOptions,
            log: Callable[[str], None] | None = print,
            compilation_cache: str | None = None, home: str | None = None) -> list[RunResult]:
  """Runs every unfinished run of ``runs`` as a task on the Ray cluster of ``options``.

  What Ray itself writes in this process (its warnings, a lost node's last log lines, the
  retries it announces) goes to ``<home>/ray.log`` (:data:`RAY_LOG`; ``home`` defaults to
  the runs' common folder), not between the progress lines; one line says where.

  Returns:
    A :class:`RunResult` per run, in the order of ``runs``; all ``'stopped'`` (not started)
    after a Ctrl-C or SIGTERM while joining the cluster.

  Raises:
    ConfigError: Ray is not installed.
    DataError: no cluster at ``--ray_address``, or a node does not see the workdirs.
  """
  ray = import_ray()
  ledger = Ledger(runs, log)
  if not runs:
    return []
  folder = executor_options.shared_folder(runs)
  path = os.path.join(home or folder, RAY_LOG)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  was_connected = ray.is_initialized()
  with _ray_output_to(path) as moved:
    try:
      with terminate_as_stop():
        try:
          connect(ray, options.ray_address)
          if moved:
            ledger.log(f"ray: Ray's own messages go to {path}")
          check_storage(ray, folder)
        except (KeyboardInterrupt, StopRequested) as e:
          name = 'SIGTERM' if isinstance(e, StopRequested) else 'SIGINT'
          ledger.log(f'{name} while joining the Ray cluster at --ray_address='
                     f'{options.ray_address}: nothing started; rerun the command to go on')
          return ledger.results()
      pending = prepare(ledger)
      for _, run, _ in pending:   # a stop file a stopped earlier call left
        try:
          os.remove(os.path.join(run.workdir, STOP_FILE))
        except OSError:
          pass
      env = worker_env(compilation_cache, base=forwarded_env())
      res = dict(options.resources)
      task = ray.remote(run_task).options(
          num_cpus=res.pop('CPU', 1.0), num_gpus=res.pop('GPU', 0.0), resources=res or None,
          max_retries=RETRIES, retry_exceptions=False)
      refs = {}
      for i, run, note in pending:
        refs[task.remote(run, env)] = (i, run, note, len(attempts(run.workdir)))
      _follow(ray, refs, ledger)
    finally:
      if not was_connected and ray.is_initialized():   # ours, joined here (or half-way)
        ray.shutdown()
  return ledger.results()


@contextlib.contextmanager
def _ray_output_to(path: str) -> Iterator[bool]:
  """Within it, what Ray writes in this process goes to the end of ``path``: its C++ core's
  logs and its loggers' lines (standard error, file descriptor 2), and what its threads print
  (the errors a cluster pushes to a driver: a lost node's last log lines, the retries),
  which go to ``sys.stdout``. The lines this thread prints there (the progress lines) stay on
  standard output, and the sweep's own errors are raised, to be printed after. Yields whether
  it could open ``path`` (if not, nothing moves)."""
  try:
    log = open(path, 'a', buffering=1, encoding='utf-8', errors='replace')  # pylint: disable=consider-using-with
    log.write(f'--- sweep {os.getpid()} at {time.strftime("%Y-%m-%d %H:%M:%S")}\n')
  except OSError:
    yield False
    return
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(log.fileno(), 2)
  stdout = sys.stdout
  sys.stdout = _ByThread(stdout, log)
  try:
    yield True
  finally:
    if isinstance(sys.stdout, _ByThread):
      sys.stdout = stdout
    try:
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(saved, 2)
    os.close(saved)
    log.close()


class _ByThread(io.TextIOBase):
  """A ``sys.stdout`` that sends the writes of the thread that made it to ``own`` and those
  of every other thread (Ray's) to ``others``."""

  def __init__(self, own, others):
    super().__init__()
    self.own, self.others, self.thread = own, others, threading.get_ident()

  def _target(self):
    return self.own if threading.get_ident() == self.thread else self.others

  def write(self, text: str) -> int:
    try:
      return self._target().write(text)
    except ValueError:   # the log closed while a Ray thread still prints: drop it
      return len(text)

  def flush(self) -> None:
    try:
      self._target().flush()
    except ValueError:
      pass

  def isatty(self) -> bool:
    return self._target().isatty()

  def fileno(self) -> int:
    return self._target().fileno()

  @property
  def encoding(self) -> str:
    return self.own.encoding


def _follow(ray: Any, refs: dict[Any, tuple[int, Run, str, int]], ledger: Ledger) -> None:
  """Logs each run's tries as they start and its end as it comes; stops them on request."""
  seen = {ref: base for ref, (_, _, _, base) in refs.items()}
  with terminate_as_stop():
    while refs:
      try:
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=POLL_S)
        for ref in refs:
          i, run, note, _ = refs[ref]
          tries = attempts(run.workdir)
          for k in range(seen[ref], len(tries)):
            at = tries[k]
            where = f'node {str(at.get("node", "?"))[:12]} ({at.get("ip", at.get("host"))})'
            again = k - refs[ref][3]
            ledger.started(i, '; '.join(x for x in (
                note if not again else f'try {again + 1}, after its node was lost', where) if x))
          seen[ref] = len(tries)
        for ref in ready:
          i, run, _, _ = refs.pop(ref)
          ledger.ended(i, _result(ray, ref, run, ledger.interrupts > 0))
      except (KeyboardInterrupt, StopRequested) as e:
        ledger.interrupted(e)
        for ref, (i, run, _, base) in list(refs.items()):
          try:
            with open(os.path.join(run.workdir, STOP_FILE), 'w') as f:
              f.write('abort' if ledger.interrupts > 1 else 'stop')
          except OSError:
            pass
          if len(attempts(run.workdir)) == base:   # not started: cancelled
            ray.cancel(ref, force=False)


def _result(ray: Any, ref: Any, run: Run, stopping: bool) -> RunResult:
  try:
    a = ray.get(ref)
  except Exception as e:  # pylint: disable=broad-except
    # Cancelled before it started, or its tries ran out (RETRIES nodes or workers lost).
    name = type(e).__name__
    if stopping and 'Cancel' in name:
      return RunResult(run, 'stopped', 0.0, 'not started')
    first = (str(e).strip().splitlines() or [''])[0][:300]
    return RunResult(run, 'stopped' if stopping else 'failed', 0.0,
                     f'its Ray task failed after {RETRIES + 1} tries ({name}: {first}); rerun '
                     'the command to resume it')
  return RunResult.of(run, a)


class Ray(executor_options.Cluster):
  """The ``ray`` executor: :func:`execute`."""
  name = 'ray'
  help = 'a Ray task per run on an existing cluster'
  run = staticmethod(execute)
