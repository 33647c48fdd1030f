"""Where a sweep's runs execute: ``--executor=NAME``, a registry of executors.

Part of :mod:`fedjax_kd.sweep`. Every executor runs the same worker entry on the same run
directories (``python -m fedjax_kd.sweep --_worker``: :func:`~fedjax_kd.sweep.workers.run_one`),
so the plan, the workdirs, the resume rules and the outputs do not depend on it: a sweep begun
with one executor can be finished with another. The built-in ones:

* ``local`` (the default): worker processes on this machine, ``--jobs`` at once
  (:class:`fedjax_kd.sweep.workers.Local`).
* ``ray``: one Ray task per run on an existing cluster (:mod:`fedjax_kd.sweep.ray_executor`).
* ``slurm``: one SLURM job array, a task per run (:mod:`fedjax_kd.sweep.slurm_executor`).

Executors register like algorithms and selection methods (:func:`register`, an
:class:`~fedjax_kd.sweep.executor_options.Executor` subclass), so a sweep's config file can
add one and ``--executor`` names it. Each flag is declared once, in
:class:`~fedjax_kd.sweep.executor_options.ExecutorOptions` (its default, type, check and
help); :func:`add_flags` makes the command-line flags of ``fedjax_kd.sweep`` and of
``python -m benchmarks.reproduction run`` from it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, Callable, Sequence

from fedjax_kd import registration
from fedjax_kd.errors import ConfigError
from fedjax_kd.sweep.executor_options import Executor, ExecutorOptions
from fedjax_kd.sweep.planning import Run
from fedjax_kd.sweep.ray_executor import Ray
from fedjax_kd.sweep.slurm_executor import Slurm
from fedjax_kd.sweep.workers import Local, RunResult

# In this order, which is the order --help and errors list them in.
EXECUTORS: dict[str, type[Executor]] = {cls.name: cls for cls in (Local, Ray, Slurm)}
_BUILT_IN = frozenset(EXECUTORS)


def register(cls: type[Executor], *, replace: bool = False) -> type[Executor]:
  """Adds an executor under ``cls.name`` (usable as a class decorator), as
  ``algorithms.register`` adds an algorithm: ``--executor=<cls.name>`` then runs the sweep's
  runs with it (register in the sweep's config file, which is executed before the flag is
  checked).

  Raises:
    ValueError: not an :class:`Executor` subclass, a name that is no identifier, a built-in
      name, or a name taken by another class (without ``replace``; the same class defined
      again, as when a config file is executed twice, replaces itself).
  """
  return registration.add(EXECUTORS, cls, base=Executor, base_name='executors.Executor',
                          built_in=_BUILT_IN, where='executors.register', kind='executor',
                          replace=replace)


def unregister(name: str) -> None:
  """Removes a registered executor (built-in ones stay)."""
  registration.remove(EXECUTORS, name, built_in=_BUILT_IN)


def executor_class(name: str) -> type[Executor]:
  """The executor registered as ``name``.

  Raises:
    ConfigError: no executor has that name (it names ``--executor`` and the registered ones).
  """
  if name not in EXECUTORS:
    raise ConfigError('--executor', name, ' or '.join(EXECUTORS) + ' (or an executor your '
                      'config file registers with fedjax_kd.sweep.executors.register)')
  return EXECUTORS[name]


def add_flags(parser: argparse.ArgumentParser) -> None:
  """Adds a ``--<field>`` flag for every :class:`ExecutorOptions` field."""
  group = parser.add_argument_group('where the runs execute (docs/cluster.md)')
  for f in dataclasses.fields(ExecutorOptions):
    text = f.metadata['help']
    if f.name == 'executor':
      text += ': ' + ', '.join(f'{n} ({c.help})' for n, c in EXECUTORS.items())
    kw: dict[str, Any] = {'default': f.default, 'help': text + (
        f' (default: {f.default})' if f.default not in ('', False) else '')}
    if f.type in (bool, 'bool'):
      kw['action'] = 'store_true'
    else:
      kw['type'] = int if f.type in (int, 'int') else str
      if f.metadata.get('metavar'):
        kw['metavar'] = f.metadata['metavar']
    group.add_argument(f'--{f.name}', **kw)


def options_from(args: argparse.Namespace) -> ExecutorOptions:
  """The :class:`ExecutorOptions` of parsed flags (:func:`add_flags`), its executor one that
  is registered (call it after the config file, which may register one, is executed).

  Raises:
    ConfigError: a flag's value is not allowed (it names the flag).
  """
  options = ExecutorOptions(**{f.name: getattr(args, f.name)
                               for f in dataclasses.fields(ExecutorOptions)})
  executor_class(options.executor)
  return options


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
    ConfigError: the executor is not registered, or cannot start (its package missing, no
      cluster, the workdirs not on storage every node sees): nothing ran.
  """
  options = options or ExecutorOptions()
  return executor_class(options.executor)().execute(
      runs, options, jobs=jobs, log=log, compilation_cache=compilation_cache, home=home)
