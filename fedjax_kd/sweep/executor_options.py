"""The executors' options and what they share: ``--executor`` and its settings, declared
once, the :class:`Executor` every executor subclasses, and the shared-storage check's files.

Part of :mod:`fedjax_kd.sweep`: :mod:`~fedjax_kd.sweep.executors` holds the registry and
runs a sweep with the executor these options name; :mod:`~fedjax_kd.sweep.workers`,
:mod:`~fedjax_kd.sweep.ray_executor` and :mod:`~fedjax_kd.sweep.slurm_executor` define the
built-in ones.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from typing import Any, Callable, ClassVar, Sequence

from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.sweep.planning import Run

PROBE_PREFIX = '.fedjax_kd_storage_probe_'   # the shared-storage check's file (removed after)


def _resources(text: str, flag: str = '--run_resources') -> dict[str, float]:
  """``'CPU=4,GPU=1'`` (any resource name a cluster declares) as ``{'CPU': 4.0, 'GPU': 1.0}``."""
  out: dict[str, float] = {}
  for part in text.split(','):
    if not part.strip():
      continue
    name, eq, amount = part.partition('=')
    try:
      value = float(amount)
    except ValueError:
      value = -1.0
    if not eq or not name.strip() or value < 0 or name.strip() in out:
      raise ConfigError(flag, text, 'NAME=AMOUNT pairs, each name once, e.g. CPU=4,GPU=1')
    out[name.strip()] = value
  return out


# A flag's check: (value, '--name') -> the value to keep, or ConfigError naming the flag.
def _pairs(text: str, flag: str) -> str:
  _resources(text, flag)
  return text


def _slurm_time(text: str, flag: str) -> str:
  if text and not re.fullmatch(r'(\d+-)?\d+(:\d+){0,2}', text):
    raise ConfigError(flag, text, "SLURM's time format, e.g. 90, 4:00:00 or 1-12:00:00")
  return text


def _at_least(lo: int) -> Callable[[int, str], int]:
  def check(v: int, flag: str) -> int:
    if v < lo:
      raise ConfigError(flag, v, f'an integer >= {lo}')
    return v
  return check


def _template(path: str, flag: str) -> str:
  if path and not os.path.isfile(path):
    raise ConfigError(flag, path, 'an sbatch script file (see docs/cluster.md)')
  return os.path.abspath(path) if path else ''


def _identifier(v: str, flag: str) -> str:
  # Which names are registered is the registry's check (executors.executor_class), made
  # once the config file, which may register one, has been executed.
  if not isinstance(v, str) or not v.isidentifier():
    raise ConfigError(flag, v, 'the name of a registered executor, e.g. local, ray or slurm')
  return v


def _flag(default: Any, help_text: str, check: Callable[[Any, str], Any] | None = None,
          metavar: str | None = None) -> Any:
  """A field of :class:`ExecutorOptions` and its flag: default, help, check and metavar, in
  one place."""
  return dataclasses.field(default=default, metadata={
      'help': help_text, 'check': check, 'metavar': metavar})


@dataclasses.dataclass(frozen=True)
class ExecutorOptions:
  """Where and how a sweep's runs execute; a field per command-line flag (``--<name>``)."""
  executor: str = _flag('local', 'where the runs execute: a registered executor',
                        _identifier, metavar='NAME')
  ray_address: str = _flag('auto', "the Ray cluster: auto (the one this machine belongs "
                           "to, as 'ray start' left it) or HOST:PORT of its head", metavar='ADDR')
  run_resources: str = _flag('CPU=1', 'Ray resources each run holds, NAME=AMOUNT pairs '
                             '(e.g. CPU=4,GPU=1)', _pairs, metavar='PAIRS')
  slurm_partition: str = _flag('', 'sbatch --partition (default: the cluster\'s)',
                               metavar='NAME')
  slurm_time: str = _flag('', 'sbatch --time, a run\'s limit (e.g. 4:00:00)', _slurm_time,
                          metavar='TIME')
  slurm_gpus: int = _flag(0, 'GPUs per run (sbatch --gpus-per-task)', _at_least(0),
                          metavar='N')
  slurm_cpus: int = _flag(1, 'CPUs per run (sbatch --cpus-per-task)', _at_least(1),
                          metavar='N')
  slurm_max_running: int = _flag(0, 'at most this many runs at once (the array\'s %%N; 0: no '
                                 'limit)', _at_least(0), metavar='N')
  slurm_template: str = _flag('', 'your own sbatch script (#SBATCH lines for your account, '
                              'modules, environment) with {command} where the run goes',
                              _template, metavar='FILE')
  detach: bool = _flag(False, 'slurm: submit and return at once (rerun the command to '
                       'collect)')

  def __post_init__(self):
    for f in dataclasses.fields(self):   # each field's own check; it names its flag
      if f.metadata['check'] is not None:
        object.__setattr__(self, f.name,
                           f.metadata['check'](getattr(self, f.name), f'--{f.name}'))

  @property
  def resources(self) -> dict[str, float]:
    return _resources(self.run_resources)


class Executor:
  """Where a sweep's runs execute: ``--executor=<name>``.

  Subclass it, set :attr:`name` and :attr:`help`, write :meth:`execute`, and add it with
  :func:`fedjax_kd.sweep.executors.register` (in the sweep's config file, as an algorithm is
  registered); ``--executor=<name>`` then runs sweeps with it. An executor decides only where
  and when each run's worker entry runs (``python -m fedjax_kd.sweep --_worker=<workdir>``:
  :func:`fedjax_kd.sweep.workers.run_one`); the plan, the workdirs, the resume rules and the
  outputs are the same for every executor, so a sweep begun with one can be finished with
  another.
  """
  name: ClassVar[str] = ''   # the --executor value (an identifier)
  help: ClassVar[str] = ''   # one line for --help: what runs where

  def execute(self, runs: Sequence[Run], options: 'ExecutorOptions', *, jobs: int,
              log: Callable[[str], None] | None, compilation_cache: str | None,
              home: str | None) -> list[Any]:
    """Runs every unfinished run of ``runs``; the arguments are
    :func:`fedjax_kd.sweep.executors.execute`'s.

    Returns:
      A :class:`~fedjax_kd.sweep.workers.RunResult` per run, in the order of ``runs``.

    Raises:
      ConfigError or DataError: the executor cannot start; nothing ran.
    """
    raise NotImplementedError(f'{type(self).__name__}.execute')


class Cluster(Executor):
  """An executor of a cluster's scheduler: :attr:`run` is its module's ``execute(runs,
  options, log=, compilation_cache=, home=)``; the cluster runs as many runs at once as its
  resources allow (``--jobs`` is the local executor's)."""
  run: ClassVar[Callable[..., list[Any]]]

  def execute(self, runs, options, *, jobs, log, compilation_cache, home):
    del jobs
    return self.run(runs, options, log=log, compilation_cache=compilation_cache, home=home)


def shared_folder(runs: Sequence[Run]) -> str:
  """The deepest folder holding every run's workdir (made if missing): where the
  shared-storage check and the SLURM files go."""
  dirs = [os.path.abspath(r.workdir) for r in runs]
  root = os.path.commonpath(dirs) if len(dirs) > 1 else os.path.dirname(dirs[0])
  os.makedirs(root, exist_ok=True)
  return root


def write_probe(folder: str) -> tuple[str, str]:
  """Writes a file with a fresh token into ``folder``; returns its path and the token."""
  token = uuid.uuid4().hex
  path = os.path.join(folder, PROBE_PREFIX + token)
  with open(path, 'w') as f:
    f.write(token)
  return path, token


def read_probe(path: str) -> str:
  """What a node reads of the probe file: its token, or why it could not."""
  try:
    with open(path) as f:
      return f.read()
  except OSError as e:
    return f'cannot read it ({e.strerror or e})'


def storage_error(executor: str, where: str, path: str, got: str) -> DataError:
  """The one line for a node that does not see the driver's files."""
  return DataError(
      f'--executor={executor}: {where} does not see this machine\'s files: it read {got!r} '
      f'from {path}, written here just now. Every node must see the sweep\'s folder at the '
      'same path (shared storage such as NFS: put --out there); nothing was started')
