"""The ``ray`` executor: a sweep's runs as Ray tasks on an existing cluster.

Part of :mod:`fedjax_kd.sweep` (:mod:`~fedjax_kd.sweep.executors` chooses it). Each run is
one task holding ``--run_resources`` (default one CPU); on the node Ray picks, the task starts
the worker process every executor uses (``python -m fedjax_kd.sweep --_worker=-``), hands it
the run's directory and returns its answer. Ray decides how many run at once: as many as the
cluster's resources hold.

* **Shared storage first.** Before anything runs, this process writes a file beside the
  workdirs and a task on every live node reads it back; a node that cannot is one line
  (:func:`~fedjax_kd.sweep.executor_options.storage_error`) and nothing starts.
* **A node lost.** Ray retries a task whose node or worker died (:data:`RETRIES` times) on
  another node; the run resumes there from its newest checkpoint, after waiting for the
  lost process's lock on the directory to go (:func:`~fedjax_kd.sweep.workers.await_free`).
  Each try appends its node to the run's ``sweep_attempts.jsonl``.
* **Ctrl-C / SIGTERM.** Tasks not yet started are cancelled; the running runs are told
  through a file in their directory (:data:`~fedjax_kd.sweep.planning.STOP_FILE`, which a
  task watches), stop after their current round with a checkpoint, and answer; a second
  Ctrl-C aborts them.

Every node needs fedjax_kd and Ray installed in the Python it runs tasks with, and the
sweep's folder (and a ``--config`` file) at the same path.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from typing import Any, Callable, Sequence

from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.sweep import executor_options
from fedjax_kd.sweep.planning import STOP_FILE, Run
from fedjax_kd.sweep.workers import (
    PARENT_ENV, RUNS_PER_WORKER, WHERE_ENV, Ledger, RunResult, StopRequested, Worker, attempts,
    await_free, prepare, terminate_as_stop, worker_env)

RETRIES = 3            # tries of a run after the first, where its node or worker died
POLL_S = 0.5           # how often the driver looks for ended and started runs
PROBE_TIMEOUT_S = 120  # how long a node may take to answer the shared-storage check


def import_ray() -> Any:
  """Ray, or the one line saying how to install it."""
  try:
    import ray  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise ConfigError('--executor', 'ray', "Ray installed: pip install 'fedjax_kd[ray]' (on "
                      'this machine and every node)') from None
  return ray


def connect(ray: Any, address: str) -> bool:
  """Connects this process to the cluster at ``address``; False if it already was.

  Raises:
    DataError: no cluster answers there (Ray never starts one here).
  """
  if ray.is_initialized():
    return False
  try:
    ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
  except (ConnectionError, RuntimeError, ValueError) as e:
    first = (str(e).strip().splitlines() or [type(e).__name__])[0]
    raise DataError(f'--executor=ray: no Ray cluster at --ray_address={address} ({first}); '
                    "start one with 'ray start --head' (docs/cluster.md)") from None
  return True


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
  worker = _kept_worker({**worker_env(None), **env, WHERE_ENV: json.dumps(where),
                         PARENT_ENV: str(os.getpid())})
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
  answer['where'] = where
  return answer


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
            compilation_cache: str | None = None) -> list[RunResult]:
  """Runs every unfinished run of ``runs`` as a task on the Ray cluster of ``options``.

  Returns:
    A :class:`RunResult` per run, in the order of ``runs``.

  Raises:
    ConfigError: Ray is not installed.
    DataError: no cluster at ``--ray_address``, or a node does not see the workdirs.
  """
  ray = import_ray()
  ledger = Ledger(runs, log)
  if not runs:
    return []
  owner = connect(ray, options.ray_address)
  try:
    check_storage(ray, executor_options.shared_folder(runs))
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
    if owner:
      ray.shutdown()
  return ledger.results()


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
