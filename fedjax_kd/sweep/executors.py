"""Where a sweep's runs execute: ``--executor=local|ray|slurm``.

Part of :mod:`fedjax_kd.sweep`. Every executor runs the same worker entry on the same run
directories (``python -m fedjax_kd.sweep --_worker``: :func:`~fedjax_kd.sweep.workers.run_one`),
so the plan, the workdirs, the resume rules and the outputs do not depend on it: a sweep begun
with one executor can be finished with another.

* ``local`` (the default): worker processes on this machine, ``--jobs`` at once
  (:func:`fedjax_kd.sweep.workers.execute`).
* ``ray``: one Ray task per run on an existing cluster (:mod:`fedjax_kd.sweep.ray_executor`).
* ``slurm``: one SLURM job array, a task per run (:mod:`fedjax_kd.sweep.slurm_executor`).

Each flag is declared once, in :class:`~fedjax_kd.sweep.executor_options.ExecutorOptions`
(its default, type, check and help); ``add_flags`` makes the command-line flags of
``fedjax_kd.sweep`` and of ``benchmarks/reproduction.py run`` from it.
"""

from __future__ import annotations

from typing import Callable, Sequence

from fedjax_kd.sweep.executor_options import (  # pylint: disable=unused-import
    ExecutorOptions, add_flags, options_from)
from fedjax_kd.sweep.planning import Run
from fedjax_kd.sweep.workers import RunResult, execute as execute_local


def execute(runs: Sequence[Run], options: ExecutorOptions | None = None, jobs: int = 1,
            log: Callable[[str], None] | None = print,
            compilation_cache: str | None = None, home: str | None = None) -> list[RunResult]:
  """Runs every unfinished run of ``runs`` with the executor ``options`` name.

  Args:
    runs: from :func:`fedjax_kd.sweep.plan`.
    options: the executor and its settings (None: ``local``).
    jobs: the ``local`` executor's worker processes at once (a cluster's executor runs as
      many as its resources allow: ``--run_resources``, ``--slurm_max_running``).
    log: where the progress lines go; None for silence.
    compilation_cache: as :func:`fedjax_kd.sweep.workers.execute`'s (a directory every node
      sees, for a cluster).
    home: the folder of the sweep (``--out``; the reproduction's ``--runs``), where an
      executor keeps its own files (SLURM's: ``<home>/slurm``; Ray's log: ``<home>/ray.log``);
      default the runs' common folder.

  Returns:
    A :class:`RunResult` per run, in the order of ``runs``.

  Raises:
    ConfigError: the executor cannot start (its package missing, no cluster, the workdirs
      not on storage every node sees): nothing ran.
  """
  options = options or ExecutorOptions()
  if options.executor == 'ray':
    from fedjax_kd.sweep import ray_executor  # pylint: disable=g-import-not-at-top
    return ray_executor.execute(runs, options, log=log, compilation_cache=compilation_cache,
                                home=home)
  if options.executor == 'slurm':
    from fedjax_kd.sweep import slurm_executor  # pylint: disable=g-import-not-at-top
    return slurm_executor.execute(runs, options, log=log, compilation_cache=compilation_cache,
                                  home=home)
  return execute_local(runs, jobs=jobs, log=log, compilation_cache=compilation_cache)
