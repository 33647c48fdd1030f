"""The ``slurm`` executor: a sweep's runs as one SLURM job array, a task per run.

Part of :mod:`fedjax_kd.sweep` (:mod:`~fedjax_kd.sweep.executors` chooses it). It calls
SLURM's own commands (``sbatch``, ``squeue``, ``scancel``, ``scontrol``) on the machine the
sweep runs on, a login node: each array task runs the worker process every executor uses
(``python -m fedjax_kd.sweep --_worker=-``) on the run directory of its line of a run list,
with its output in the run's ``sweep.log`` and its one-line answer in the task's
``slurm/<job>_<task>.out`` in the sweep's folder. Not submitit: a sweep's runs are
already command lines on files, so a plain sbatch script, which a user can read, rerun by
hand or adapt (``--slurm_template``), is all a task needs, with nothing pickled between
Python versions.

* **Rerunning** the command skips finished runs, leaves runs whose array task is still
  pending or running (the ``jobs.jsonl`` of each submission, read against ``squeue``) to
  that task, and submits one new array for the rest. A cancelled, preempted or timed-out
  task's run resumes from its newest checkpoint there: SLURM's SIGTERM (``scancel``,
  preemption, the time limit's warning) stops a run after its current round with a
  checkpoint, as Ctrl-C does.
* **Waiting.** The command follows the tasks with ``squeue`` until every one has ended,
  then the sweep writes its outputs; ``--detach`` returns once submitted (rerun the command
  to collect). Ctrl-C while waiting cancels the pending tasks and sends the running ones
  SIGINT (they stop after their round, with a checkpoint); a second Ctrl-C aborts them.
* **Storage.** The run list and the script are written beside the workdirs; a task whose
  node cannot read them says so in its ``.out`` file, and its run is reported failed with
  that line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import executor_options
from fedjax_kd.sweep.planning import LOG_FILE, Run, read_json_lines
from fedjax_kd.sweep.workers import (
    WHERE_ENV, Ledger, RunResult, StopRequested, prepare, terminate_as_stop, worker_env)

SLURM_DIR = 'slurm'      # in the sweep's folder: scripts, run lists, jobs.jsonl, task outputs
JOBS_FILE = 'jobs.jsonl'  # one line per submission: the array job and its run directories
POLL_S = 3.0             # how often squeue is asked while waiting
JOB_NAME = 'fedjax_kd'
TOOLS = ('sbatch', 'squeue', 'scancel', 'scontrol')

SCRIPT = '''#!/bin/bash
# fedjax_kd sweep: array task k runs line k+1 of the run list. sbatch's flags (array,
# output, resources) are on its command line: {sbatch}
{command}
'''
COMMAND = '''RUNDIR="$(sed -n "$((SLURM_ARRAY_TASK_ID + 1))p" {list})"
if [ ! -d "$RUNDIR" ]; then
  echo "error: node $SLURMD_NODENAME cannot see the run directory '$RUNDIR' (line \
$((SLURM_ARRAY_TASK_ID + 1)) of {list}): every node must see the sweep's folder at the same \
path (shared storage)" >&2
  exit 2
fi
CONTROLLER="${{SLURM_WORKING_CLUSTER#*:}}"   # CLUSTER:HOST:PORT:...: the controller's HOST:PORT
{env}export {where}="{{\\"executor\\": \\"slurm\\", \\"job\\": \\"${{SLURM_ARRAY_JOB_ID}}_\
${{SLURM_ARRAY_TASK_ID}}\\", \\"node\\": \\"${{SLURMD_NODENAME}}\\", \
\\"controller\\": \\"${{CONTROLLER%:*:*}}\\"}}"
exec {python} -m fedjax_kd.sweep --_worker=- <<< "$RUNDIR"'''


def check_tools() -> None:
  """Raises ConfigError (one line) unless SLURM's commands are on PATH."""
  missing = [t for t in TOOLS if shutil.which(t) is None]
  if missing:
    raise ConfigError('--executor', 'slurm', "a machine with SLURM's commands on PATH (a login "
                      f'node); {", ".join(missing)} not found')


def _call(args: Sequence[str], check: bool = True) -> str:
  proc = subprocess.run(list(args), capture_output=True, text=True, check=False)
  if check and proc.returncode:
    err = ' '.join((proc.stderr or proc.stdout).split())[:400]
    raise DataError(f'--executor=slurm: {" ".join(args[:2])} ... failed (status '
                    f'{proc.returncode}): {err}')
  return proc.stdout


def live_tasks(jobs: Sequence[str]) -> dict[str, str]:
  """``{'<job>_<task>': state}`` of the array tasks of ``jobs`` that squeue still lists.

  One ``squeue --me`` of this user's fedjax_kd jobs (a job SLURM has forgotten is simply
  absent, where ``squeue -j`` would fail on it).

  Raises:
    DataError: squeue failed (the caller may ask again).
  """
  if not jobs:
    return {}
  out = _call(['squeue', '--me', '-h', '-r', f'--name={JOB_NAME}', '-o', '%i %T'])
  tasks = {}
  for line in out.splitlines():
    parts = line.split()
    if len(parts) == 2 and parts[0].split('_')[0] in jobs:
      tasks[parts[0]] = parts[1]
  return tasks


def read_jobs(folder: str) -> list[dict[str, Any]]:
  """The submissions recorded in ``folder``'s :data:`JOBS_FILE`, oldest first."""
  return read_json_lines(os.path.join(folder, JOBS_FILE))


def task_answer(folder: str, task: str) -> dict[str, Any] | None:
  """The worker's answer, the last JSON line of the task's ``.out`` file (None: none)."""
  try:
    with open(os.path.join(folder, f'{task}.out'), errors='replace') as f:
      lines = f.read().splitlines()
  except OSError:
    return None
  for line in reversed(lines):
    if line.startswith('{'):
      try:
        doc = json.loads(line)
      except ValueError:
        continue
      if isinstance(doc, dict) and 'status' in doc:
        return doc
  return None


def task_state(task: str) -> str:
  """What SLURM says of an ended task (``scontrol``'s JobState; '' once it has forgotten)."""
  out = _call(['scontrol', '-o', 'show', 'job', task], check=False)
  m = re.search(r'\bJobState=(\S+)', out)
  return m.group(1) if m else ''


def _ended(folder: str, task: str, run: Run, stopping: bool) -> RunResult:
  a = task_answer(folder, task)
  if a is not None:
    return RunResult.of(run, a)
  out = os.path.join(folder, f'{task}.out')
  try:
    with open(out, errors='replace') as f:
      said = [ln for ln in f.read().splitlines() if ln.startswith('error:')]
  except OSError:
    said = []
  if said:
    return RunResult(run, 'failed', 0.0, said[-1][len('error: '):])
  state = task_state(task) or 'ended'
  return RunResult(run, 'stopped' if stopping or state not in ('COMPLETED', 'FAILED') else
                   'failed', 0.0, f'SLURM task {task} {state} without an answer (see {out} and '
                   f'{os.path.join(run.workdir, LOG_FILE)}); rerun the command to resume it')


def script(options: executor_options.ExecutorOptions, run_list: str, sbatch: Sequence[str],
           compilation_cache: str | None) -> str:
  """The array's batch script: the user's template (or a bare one) with the command."""
  env = worker_env(compilation_cache, base={})
  exports = ''.join(f'export {k}={shlex.quote(v)}\n' for k, v in sorted(env.items()))
  command = COMMAND.format(list=shlex.quote(run_list), env=exports, where=WHERE_ENV,
                           python=shlex.quote(sys.executable))
  if options.slurm_template:
    with open(options.slurm_template) as f:
      text = f.read()
    if '{command}' not in text:
      raise ConfigError('--slurm_template', options.slurm_template,
                        'an sbatch script with {command} where the run goes')
    return text.replace('{command}', command)
  return SCRIPT.format(sbatch=' '.join(sbatch), command=command)


def submit(runs: Sequence[Run], folder: str, options: executor_options.ExecutorOptions,
           compilation_cache: str | None) -> str:
  """Submits one array task per run; returns the job id (recorded in :data:`JOBS_FILE`)."""
  os.makedirs(folder, exist_ok=True)
  stamp = time.strftime('%Y%m%d-%H%M%S') + f'-{os.getpid()}'
  run_list = os.path.join(folder, f'runs-{stamp}.txt')
  workdir_lib.write_text(run_list, ''.join(os.path.abspath(r.workdir) + '\n' for r in runs))
  array = f'0-{len(runs) - 1}' + (f'%{options.slurm_max_running}'
                                  if options.slurm_max_running else '')
  sbatch = ['sbatch', '--parsable', f'--array={array}', f'--job-name={JOB_NAME}',
            f'--output={os.path.join(folder, "%A_%a.out")}',
            f'--cpus-per-task={options.slurm_cpus}']
  if options.slurm_partition:
    sbatch.append(f'--partition={options.slurm_partition}')
  if options.slurm_time:
    sbatch.append(f'--time={options.slurm_time}')
  if options.slurm_gpus:
    sbatch.append(f'--gpus-per-task={options.slurm_gpus}')
  path = os.path.join(folder, f'array-{stamp}.sbatch')
  workdir_lib.write_text(path, script(options, run_list, sbatch, compilation_cache))
  job = _call(sbatch + [path]).strip().split(';')[0]
  if not job.isdigit():
    raise DataError(f'--executor=slurm: sbatch answered {job!r}, not a job id')
  with open(os.path.join(folder, JOBS_FILE), 'a') as f:
    f.write(json.dumps({'job': job, 'script': path, 'runs': [os.path.abspath(r.workdir)
                                                           for r in runs]}) + '\n')
  return job


def execute(runs: Sequence[Run], options: executor_options.ExecutorOptions,
            log: Callable[[str], None] | None = print,
            compilation_cache: str | None = None, home: str | None = None) -> list[RunResult]:
  """Submits every unfinished run of ``runs`` not already queued as an array task, then
  follows them to their end (or returns at once with ``--detach``). Its files go to
  ``<home>/slurm`` (``home``: the sweep's folder; default the runs' common folder), the same
  for every call of the same command, so that a rerun finds the tasks still queued.

  Returns:
    A :class:`RunResult` per run, in the order of ``runs`` (``'submitted'`` for a run left
    to SLURM by ``--detach``).

  Raises:
    ConfigError: SLURM's commands are not on PATH, or the template has no ``{command}``.
    DataError: sbatch refused the array.
  """
  check_tools()
  ledger = Ledger(runs, log)
  if not runs:
    return []
  folder = os.path.join(home or executor_options.shared_folder(runs), SLURM_DIR)
  pending = prepare(ledger)
  earlier = read_jobs(folder)
  queued = live_tasks([j['job'] for j in earlier])
  tasks: dict[str, tuple[int, Run]] = {}      # '<job>_<task>' -> the run it runs
  fresh = []
  for i, run, note in pending:
    here = os.path.abspath(run.workdir)
    task = next((f'{j["job"]}_{k}' for j in reversed(earlier)
                 for k, d in enumerate(j['runs']) if d == here
                 and f'{j["job"]}_{k}' in queued), None)
    if task is None:
      fresh.append((i, run, note))
    else:
      tasks[task] = (i, run)
      ledger.line(i, 'queued', f'  (SLURM task {task}, {queued[task].lower()}, submitted '
                  'earlier)')
  if fresh:
    job = submit([r for _, r, _ in fresh], folder, options, compilation_cache)
    for k, (i, run, note) in enumerate(fresh):
      tasks[f'{job}_{k}'] = (i, run)
      ledger.line(i, 'submit', f'  (SLURM task {job}_{k}' + (f'; {note})' if note else ')'))
  if options.detach:
    for task, (i, run) in tasks.items():
      ledger.outcome[i] = RunResult(run, 'submitted', 0.0, f'SLURM task {task}')
    ledger.log(f'slurm: {len(tasks)} runs queued ({", ".join(sorted({t.split("_")[0] for t in tasks}))}); '
               'rerun the same command to collect them')
    return ledger.results()
  _follow(folder, tasks, ledger)
  return ledger.results()


def _follow(folder: str, tasks: dict[str, tuple[int, Run]], ledger: Ledger) -> None:
  """Waits for every task to leave squeue, logging each as it starts and ends."""
  jobs = sorted({t.split('_')[0] for t in tasks})
  started: set[str] = set()
  with terminate_as_stop():
    while tasks:
      try:
        try:
          queued = live_tasks(jobs)
        except DataError as e:   # a busy controller: ask again
          ledger.log(f'{e}; asking again in {POLL_S:g} s')
          time.sleep(POLL_S)
          continue
        for task in list(tasks):
          i, run = tasks[task]
          state = queued.get(task)
          if state == 'RUNNING' and task not in started:
            started.add(task)
            ledger.started(i, f'SLURM task {task}')
          elif state is None:
            ledger.ended(i, _ended(folder, task, run, ledger.interrupts > 0))
            del tasks[task]
        if tasks:
          time.sleep(POLL_S)
      except (KeyboardInterrupt, StopRequested) as e:
        signum = ledger.interrupted(e)
        for job in jobs:
          _call(['scancel', '--state=PENDING', job], check=False)
          _call(['scancel', '--batch', f'--signal={signal.Signals(signum).name[3:]}', job],
                check=False)


class Slurm(executor_options.Cluster):
  """The ``slurm`` executor: :func:`execute`."""
  name = 'slurm'
  help = 'a SLURM job array, a task per run'
  run = staticmethod(execute)
