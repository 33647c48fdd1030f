"""A sweep's plan: variants x grid cells x seeds as runs, each a workdir with its config.

Part of :mod:`fedjax_kd.sweep` (the module docstring there is the user guide).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import os
from typing import Any, Iterable, Mapping, Sequence

import ml_collections
import numpy as np

from fedjax_kd import config as config_lib
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import results
from fedjax_kd.running import workdir as workdir_lib

PLAN_FILE = 'sweep.json'          # in --out: the plan
RUN_FILE = 'sweep_run.json'       # in each run's workdir: what the worker runs
LOG_FILE = 'sweep.log'            # in each run's workdir: the worker's output for it
ATTEMPTS_FILE = 'sweep_attempts.jsonl'   # in each run's workdir: where each try of it ran
# In a run's workdir while a cluster sweep stops it: 'stop' (after the round) or 'abort'.
STOP_FILE = 'sweep_stop'
# In a run's workdir when a round left NaN or Inf and the run stopped: a result, not an error
# (the same config diverges again), so a rerun skips it; delete the file to try again.
DIVERGED_FILE = 'diverged.json'
RUNS_DIR = 'runs'


# ------------------------------------------------------------ plan
def _pairs(fields: Mapping[str, Any] | Iterable[tuple[str, Any]] | None) -> tuple:
  """``(field, value)`` pairs of a dict or pairs; lists become tuples (hashable)."""
  if fields is None:
    return ()
  items = fields.items() if isinstance(fields, Mapping) else fields
  return tuple((str(k), tuple(v) if isinstance(v, list) else v) for k, v in items)


@dataclasses.dataclass(frozen=True)
class Variant:
  """A labelled algorithm with its own config fields.

  Attributes:
    label: the name in tables and legends, e.g. ``'DS-FL SA'``.
    algorithm: the config's ``algorithm``.
    overrides: dotted fields set for this variant, e.g.
      ``{'dsfl.aggregation': 'sa'}`` (a dict or ``(field, value)`` pairs;
      stored as pairs).
  """
  label: str
  algorithm: str
  overrides: tuple[tuple[str, Any], ...] = ()

  def __post_init__(self):
    object.__setattr__(self, 'overrides', _pairs(self.overrides))

  @property
  def fields(self) -> dict[str, Any]:
    """``algorithm`` and the overrides as one dict."""
    return {'algorithm': self.algorithm, **dict(self.overrides)}

  @property
  def slug(self) -> str:
    return results.slug(self.label)


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep.

  Attributes:
    variant: its :class:`Variant`.
    cell: the grid cell, ``(field, value)`` pairs (empty without a grid).
    seed: the config's ``seed``.
    workdir: the run's directory.
    config: the resolved, validated config.
    config_file: the config file (``/absolute/file.py[:ARG]``) the worker executes before it
      builds ``config``, so that what the file registers (an algorithm, a model, a data
      source) exists in the worker too; None: nothing to execute.
  """
  variant: Variant
  cell: tuple[tuple[str, Any], ...]
  seed: int
  workdir: str
  config: ml_collections.ConfigDict = dataclasses.field(compare=False, repr=False)
  config_file: str | None = dataclasses.field(default=None, compare=False)

  @property
  def name(self) -> str:
    """``<variant-slug>[/<cell-slug>]/seed<k>``, the workdir below ``<out>/runs``."""
    parts = [self.variant.slug] + ([cell_slug(self.cell)] if self.cell else [])
    return '/'.join(parts + [f'seed{self.seed}'])

  @property
  def rounds(self) -> int:
    return int(self.config.rounds)


def cell_slug(cell: Sequence[tuple[str, Any]]) -> str:
  """``(('cache.duration', 5),)`` -> ``'duration-5'`` (the field's last part).

  The full dotted field is used where two grid fields end in the same name.
  """
  last = [f.rsplit('.', 1)[-1] for f, _ in cell]
  names = [f if last.count(n) > 1 else n for (f, _), n in zip(cell, last)]
  return '_'.join(f'{results.slug(n)}-{results.slug(v)}' for n, (_, v) in zip(names, cell))


def cell_label(cell: Sequence[tuple[str, Any]]) -> str:
  """``(('cache.duration', 5),)`` -> ``'cache.duration=5'``."""
  return ', '.join(f'{f}={show_value(v)}' for f, v in cell)


def show_value(v: Any) -> str:
  """A grid or field value as text: ``('cnn@1.0',)`` -> ``(cnn@1.0,)``."""
  if isinstance(v, (tuple, list)):
    return '(' + ','.join(show_value(x) for x in v) + (',)' if len(v) == 1 else ')')
  return str(v)


def apply_overrides(config: ml_collections.ConfigDict,
                    fields: Mapping[str, Any] | Iterable[tuple[str, Any]]
                    ) -> ml_collections.ConfigDict:
  """Sets dotted fields in place (like :func:`fedjax_kd.config.override`); returns ``config``.

  Raises:
    ConfigError: a group on the path does not exist, or the value's type does
      not fit the field (an unknown leaf is left to
      :func:`fedjax_kd.config.check_fields`, which names the closest field).
  """
  for field, value in _pairs(fields):
    node = config
    *path, last = field.split('.')
    for i, part in enumerate(path):
      try:
        node = node[part]
      except (KeyError, AttributeError, TypeError):
        raise ConfigError(field, value, f"a known field ('{'.'.join(path[:i + 1])}' is not a "
                          'config group)') from None
      if not isinstance(node, ml_collections.ConfigDict):
        raise ConfigError(field, value, f"a known field ('{'.'.join(path[:i + 1])}' is not a "
                          'config group)')
    try:
      node[last] = value
    except (TypeError, ValueError):
      try:
        kind = type(node[last]).__name__
      except (KeyError, AttributeError):
        kind = "the field's type"
      raise ConfigError(field, value, f'a value of type {kind}') from None
  return config


def plan(base_config: ml_collections.ConfigDict, variants: Sequence[Variant],
         seeds: Sequence[int], grid: Mapping[str, Sequence[Any]] | None, out: str,
         overrides: Mapping[str, Any] | None = None, config_file: str | None = None
         ) -> list[Run]:
  """Every (variant, grid cell, seed) run, each config validated as its worker builds it.

  The check is the worker's own path (:func:`run_file` -> :func:`config_of`): the config file
  executed (here it already was, so nothing runs twice), the config read back from the JSON
  the worker reads, then validated. A config that only this process could build fails here,
  before anything trains, not in every worker.

  Args:
    base_config: the config every run starts from (not modified).
    variants: the variants, in table order.
    seeds: the seeds of every variant and cell.
    grid: ``{field: values}``; the cross product of the values (in field
      order) is run for every variant. None or empty: no grid.
    out: the sweep's output directory; workdirs go under ``<out>/runs``.
    overrides: fields set on every run after the variant and the cell.
    config_file: the file ``base_config`` came from (``PATH[:ARG]`` or a shipped name; see
      :attr:`Run.config_file`). Without it, whatever ``base_config`` needs registered must
      be registered in every worker some other way (a module the workers import).

  Returns:
    The runs, variant-major, then cell, then seed.

  Raises:
    ConfigError: a field of some run is bad (the message names the field and
      the run), or two variant labels, cells or seeds would share a workdir.
  """
  file = config_lib.absolute_path(config_file) if config_file else None
  grid = dict(grid or {})
  for field, values in grid.items():
    if not values:
      raise ConfigError(field, values, 'at least one grid value')
  cells = [tuple(zip(grid, combo)) for combo in itertools.product(*grid.values())]
  if len(set(cell_slug(c) for c in cells)) < len(cells):
    raise ConfigError('--set', list(grid.items()), 'grid values with distinct names')
  if len(set(v.slug for v in variants)) < len(variants):
    raise ConfigError('--variant', [v.label for v in variants],
                      'labels that differ in more than punctuation and case')
  if len(set(seeds)) < len(seeds):
    raise ConfigError('--seeds', list(seeds), 'distinct seeds')
  if not variants:
    raise ConfigError('--algorithms', '', 'at least one variant (--algorithms or --variant)')
  runs = []
  for variant in variants:
    for cell in cells:
      for seed in seeds:
        c = copy.deepcopy(base_config)
        name = Run(variant, cell, int(seed), '', c).name
        try:
          apply_overrides(c, variant.fields)
          apply_overrides(c, cell)
          apply_overrides(c, overrides or {})
          apply_overrides(c, {'seed': int(seed)})
          run = Run(variant, cell, int(seed), os.path.join(out, RUNS_DIR, name), c, file)
          config_lib.validate(config_of(run_file(run)))
        except ConfigError as e:
          allowed = e.allowed.rstrip('.')
          raise ConfigError(e.field, e.value, f'{allowed} [run {name}]') from None
        runs.append(run)
  return runs


def run_file(run: Run) -> dict[str, Any]:
  """What ``<workdir>/sweep_run.json`` holds: the run, its config as JSON, and the config
  file its worker executes first."""
  doc = {'label': run.variant.label, 'algorithm': run.variant.algorithm,
         'cell': [list(p) for p in run.cell], 'seed': run.seed,
         'config': json.loads(config_json(run.config))}
  if run.config_file:
    doc['config_file'] = run.config_file
  return doc


def config_of(doc: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """The config a worker runs, from a run's file (:func:`run_file`): the config file is
  executed first, once per process (:func:`fedjax_kd.config.run_file_once`), so that what it
  registers exists, then the recorded fields are read.

  Raises:
    ConfigError: (field ``--config``) the recorded config file no longer loads.
  """
  if doc.get('config_file'):
    config_lib.run_file_once(doc['config_file'])
  return ml_collections.ConfigDict(doc['config'])


def config_json(config: ml_collections.ConfigDict) -> str:
  return config.to_json_best_effort(indent=2, sort_keys=True)


def write_plan(out: str, runs: Sequence[Run], **info: Any) -> str:
  """Writes ``<out>/sweep.json``: the plan, so outputs can be rebuilt from files alone.

  Args:
    out: the sweep's output directory.
    runs: the planned runs.
    **info: JSON-able facts about the sweep kept as given, e.g. ``config``
      (the file), ``overrides``, ``thresholds``, ``metrics``, ``meta``.

  Returns:
    The path written.
  """
  os.makedirs(out, exist_ok=True)
  variants, cells, seeds = [], [], []
  for r in runs:
    v = {'label': r.variant.label, 'algorithm': r.variant.algorithm,
         'overrides': dict(r.variant.overrides)}
    if v not in variants:
      variants.append(v)
    if list(map(list, r.cell)) not in cells:
      cells.append(list(map(list, r.cell)))
    if r.seed not in seeds:
      seeds.append(r.seed)
  grid: dict[str, list[Any]] = {}
  for cell in cells:
    for f, v in cell:
      if v not in grid.setdefault(f, []):
        grid[f].append(v)
  doc = {'variants': variants, 'grid': grid, 'seeds': seeds, **info,
         'runs': [{'variant': r.variant.label, 'algorithm': r.variant.algorithm,
                   'cell': [list(p) for p in r.cell], 'seed': r.seed,
                   'workdir': os.path.relpath(r.workdir, out), 'rounds': r.rounds}
                  for r in runs]}
  path = os.path.join(out, PLAN_FILE)
  workdir_lib.write_text(path, json.dumps(doc, indent=2, default=jsonable) + '\n')
  return path


def jsonable(v: Any) -> Any:
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, (set, frozenset)):
    return sorted(v)
  return str(v)


def read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def read_json_lines(path: str) -> list[Any]:
  """Each line of a JSON-lines file, oldest first: none for a missing file, and a line that
  is not JSON (torn by a process killed while writing it) left out."""
  out = []
  try:
    with open(path) as f:
      for line in f:
        try:
          out.append(json.loads(line))
        except ValueError:
          continue
  except OSError:
    pass
  return out


# ------------------------------------------------------------ worker side
def load_run_config(rundir: str) -> ml_collections.ConfigDict:
  """The config a worker runs: ``<rundir>/sweep_run.json`` read by :func:`config_of`.

  Raises:
    DataError: the file is missing or not valid JSON.
    ConfigError: its config file no longer loads.
  """
  doc = read_json(os.path.join(rundir, RUN_FILE))
  if not isinstance(doc, dict) or not isinstance(doc.get('config'), dict):
    raise DataError(f'{rundir} has no readable {RUN_FILE}: is it a sweep run directory?')
  return config_of(doc)


def load_plan(out: str) -> dict[str, Any]:
  """A sweep's ``sweep.json``.

  Raises:
    DataError: it is missing or unreadable.
  """
  doc = read_json(os.path.join(out, PLAN_FILE))
  if not isinstance(doc, dict):
    raise DataError(f'{out} has no readable {PLAN_FILE}: is it a sweep --out directory?')
  return doc
