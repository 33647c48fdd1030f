r"""Multi-seed sweeps: variants x grid cells x seeds, run in worker processes, summarised.

  python -m fedjax_kd.sweep --config=configs/default.py --algorithms=dsfl,fd,single \
      --seeds=0,1,2 --out=runs/sweep_digits --jobs=2
  python -m fedjax_kd.sweep --config=configs/default.py \
      --variant 'DS-FL ERA=dsfl;dsfl.aggregation="era"' \
      --variant 'DS-FL SA=dsfl;dsfl.aggregation="sa"' \
      --variant "FedAvg=fedavg;clients.models=('cnn@1.0',)" --out=runs/dsfl_digits
  python -m fedjax_kd.sweep --config=configs/scarlet_digits.py --algorithms=scarlet \
      --set cache.duration=0,5,10,20 --metrics=hit_ratio --out=runs/scarlet_d
  python -m fedjax_kd.sweep ... --dry_run          # print the plan only

Every (variant, grid cell, seed) is one run with its own workdir
``<out>/runs/<variant-slug>[/<cell-slug>]/seed<k>`` (the files of
:mod:`fedjax_kd.workdir`). Each run's config is built as

  the ``--config`` file <- the variant (``algorithm`` and its fields)
  <- the grid cell <- the single-valued ``--set`` fields <- ``seed=k``,

so ``--set`` has the last word. Every run's config is validated before any
training starts: a bad field prints one ``error: ...`` line naming it and
exits with status 2.

Flags:

* ``--config=PATH[:ARG]``: a config file with ``get_config()`` (``ARG`` is
  passed to it, as ``ml_collections.config_flags`` does; :func:`fedjax_kd.config.load_file`).
* ``--algorithms=dsfl,fd``: a variant per algorithm, labelled by its name.
* ``--variant 'LABEL=ALGORITHM[;field=value;...]'`` (repeatable): a named
  variant with its own fields.
* ``--set field=value`` (repeatable): an override of every run;
  ``--set field=v1,v2,...`` makes the field a grid axis (the cross product of
  all multi-valued ``--set`` fields is run for every variant).
* ``--seeds=0,1,2`` (default), ``--out=DIR``, ``--jobs=N`` (worker processes
  at once, default 1), ``--thresholds=0.8,0.9`` (default: the config's
  ``comm.thresholds``), ``--metrics=label_coverage,hit_ratio`` (per-round
  metrics whose mean over rounds gets a column), ``--dry_run``.

Values are Python literals (``ast.literal_eval``), else plain strings:
``--set train.learning_rate=0.05``, ``--set data.source=npz:mnist.npz``,
``--set "clients.models=('cnn@0.5','cnn@1.0')"``. Commas inside brackets,
parentheses or quotes do not split values, so a tuple is one value and
``--set "clients.models=('cnn@1.0',),('mlp@1.0',)"`` is a grid of two tuples;
write a tuple-valued field such as ``comm.thresholds`` as ``(0.8,0.9)``.

Runs execute in worker processes (``python -m fedjax_kd.sweep --_worker=-``,
up to ``--jobs`` at once, each taking runs one after the other) calling
:func:`fedjax_kd.runner.run` with ``resume=True``, so rerunning the same
command skips every finished run (its ``summary.json`` has the planned
rounds and no ``stopped_by``), resumes an interrupted one from its newest
checkpoint, and starts the rest. A failed run is reported and the sweep goes
on; the exit status is then 1. Each run's output (progress lines, warnings,
tracebacks) goes to ``<workdir>/sweep.log``; ``python -m fedjax_kd.sweep
--_worker=<workdir>`` reruns (resumes) one run in the terminal, for debugging.

Workers inherit the environment (``XLA_FLAGS``, ``CUDA_VISIBLE_DEVICES``,
...). Compiled programs are shared between workers, reruns and
``fedjax_kd.main`` runs through JAX's persistent compilation cache, chosen as
``fedjax_kd.main`` chooses it (:mod:`fedjax_kd.compile_cache`):
``--compilation_cache=DIR``, else ``$FEDJAX_KD_COMPILATION_CACHE``, else
``$JAX_COMPILATION_CACHE_DIR``, else ``~/.cache/fedjax_kd/jax_cache``
(``''`` or ``none`` turns it off). Thread use is
left to XLA: every worker may use all cores, so with ``--jobs > 1`` on a CPU
the workers share the cores (their rounds are slower, the sweep is usually
still faster); on one accelerator keep ``--jobs=1`` or split the devices with
``CUDA_VISIBLE_DEVICES`` yourself.

Outputs in ``--out``: ``sweep.json`` (the plan: config, variants, seeds,
grid, overrides, thresholds, metrics, every run's workdir), ``compare.csv``
and ``compare.md`` (one row per variant and grid cell: mean +- sample std
over seeds of final and best accuracy, mean client accuracy, bytes, rounds
and bytes to each threshold with how many seeds reached it, wall time and
the extra metrics) and ``accuracy_test_acc.png`` (+ ``accuracy_client_acc.png``
where runs log client accuracy): mean curves with a +-std band against the
round and against cumulative bytes. :func:`aggregate` and
:func:`write_outputs` regenerate them from the workdirs alone.

Exit codes: 0 every run finished (or was skipped); 1 a run failed; 2 bad
flags or config (nothing ran); 130/143 stopped by SIGINT/SIGTERM (the
running runs checkpoint first; rerun to resume).

Library use::

  from fedjax_kd import presets, sweep
  variants = [sweep.Variant('ERA', 'dsfl'),
              sweep.Variant('SA', 'dsfl', {'dsfl.aggregation': 'sa'})]
  runs = sweep.plan(presets.digits(), variants, seeds=(0, 1, 2), grid={}, out='runs/x')
  sweep.write_plan('runs/x', runs)
  results = sweep.execute(runs, jobs=2)
  cells = sweep.aggregate('runs/x')
  sweep.write_outputs('runs/x', cells, thresholds=(0.8, 0.9))
"""

from __future__ import annotations

import argparse
import ast
import copy
import csv
import dataclasses
import importlib.util
import io
import itertools
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Mapping, Sequence

import ml_collections
import numpy as np

from fedjax_kd import compile_cache
from fedjax_kd import config as config_lib
from fedjax_kd import workdir as workdir_lib
from fedjax_kd.errors import ConfigError, DataError, DivergenceError

PLAN_FILE = 'sweep.json'          # in --out: the plan
RUN_FILE = 'sweep_run.json'       # in each run's workdir: what the worker runs
LOG_FILE = 'sweep.log'            # in each run's workdir: the worker's output for it
# In a run's workdir when a round left NaN or Inf and the run stopped: a result, not an error
# (the same config diverges again), so a rerun skips it; delete the file to try again.
DIVERGED_FILE = 'diverged.json'
RUNS_DIR = 'runs'
RUNS_PER_WORKER = 20              # a worker process is replaced after this many runs
MB = 1e6

# Statistics of a cell, in table order: (key, column header, kind).
BASE_STATS = (
    ('final_acc', 'final acc', 'acc'),
    ('best_acc', 'best acc', 'acc'),
    ('last10_acc', 'last-10 acc', 'acc'),
    ('final_client_acc', 'final client acc', 'acc'),
    ('best_client_acc', 'best client acc', 'acc'),
    ('total_bytes', 'total MB', 'bytes'),
    ('bytes_per_round', 'kB / round', 'kbytes'),
    ('rounds', 'rounds', 'num'),
    ('wall_s', 'wall s', 'num'),
)
METRIC_NAMES = {
    'test_acc': 'test accuracy',           # the server model; the mean client model where none
    'client_acc': 'mean client accuracy',  # the mean of the client models' test accuracies
}


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
    return slug(self.label)


@dataclasses.dataclass(frozen=True)
class Run:
  """One run of a sweep.

  Attributes:
    variant: its :class:`Variant`.
    cell: the grid cell, ``(field, value)`` pairs (empty without a grid).
    seed: the config's ``seed``.
    workdir: the run's directory.
    config: the resolved, validated config.
  """
  variant: Variant
  cell: tuple[tuple[str, Any], ...]
  seed: int
  workdir: str
  config: ml_collections.ConfigDict = dataclasses.field(compare=False, repr=False)

  @property
  def name(self) -> str:
    """``<variant-slug>[/<cell-slug>]/seed<k>``, the workdir below ``<out>/runs``."""
    parts = [self.variant.slug] + ([cell_slug(self.cell)] if self.cell else [])
    return '/'.join(parts + [f'seed{self.seed}'])

  @property
  def rounds(self) -> int:
    return int(self.config.rounds)


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


def slug(text: Any) -> str:
  """A lower-case, path-safe form: ``'DS-FL (ERA, T=0.1)'`` -> ``'ds-fl-era-t-0.1'``."""
  if isinstance(text, (tuple, list)):
    text = '+'.join(str(v) for v in text)
  out = re.sub(r'[^a-z0-9.]+', '-', str(text).lower()).strip('-.')
  return out or 'x'


def cell_slug(cell: Sequence[tuple[str, Any]]) -> str:
  """``(('cache.duration', 5),)`` -> ``'duration-5'`` (the field's last part).

  The full dotted field is used where two grid fields end in the same name.
  """
  last = [f.rsplit('.', 1)[-1] for f, _ in cell]
  names = [f if last.count(n) > 1 else n for (f, _), n in zip(cell, last)]
  return '_'.join(f'{slug(n)}-{slug(v)}' for n, (_, v) in zip(names, cell))


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
         overrides: Mapping[str, Any] | None = None) -> list[Run]:
  """Every (variant, grid cell, seed) run, each config validated.

  Args:
    base_config: the config every run starts from (not modified).
    variants: the variants, in table order.
    seeds: the seeds of every variant and cell.
    grid: ``{field: values}``; the cross product of the values (in field
      order) is run for every variant. None or empty: no grid.
    out: the sweep's output directory; workdirs go under ``<out>/runs``.
    overrides: fields set on every run after the variant and the cell.

  Returns:
    The runs, variant-major, then cell, then seed.

  Raises:
    ConfigError: a field of some run is bad (the message names the field and
      the run), or two variant labels, cells or seeds would share a workdir.
  """
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
          config_lib.validate(c)
        except ConfigError as e:
          allowed = e.allowed.rstrip('.')
          raise ConfigError(e.field, e.value, f'{allowed} [run {name}]') from None
        runs.append(Run(variant, cell, int(seed), os.path.join(out, RUNS_DIR, name), c))
  return runs


def _config_json(config: ml_collections.ConfigDict) -> str:
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
  workdir_lib.write_text(path, json.dumps(doc, indent=2, default=_jsonable) + '\n')
  return path


def _jsonable(v: Any) -> Any:
  if isinstance(v, np.generic):
    return v.item()
  if isinstance(v, (set, frozenset)):
    return sorted(v)
  return str(v)


# ------------------------------------------------------------ run state
def read_diverged(workdir: str) -> dict[str, Any] | None:
  """The run's divergence record (``{'round', 'message'}``), or None if it has none."""
  doc = _read_json(os.path.join(workdir, DIVERGED_FILE))
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
  from fedjax_kd import runner  # pylint: disable=g-import-not-at-top
  summary = _read_json(os.path.join(run.workdir, 'summary.json'))
  old = _read_json(os.path.join(run.workdir, 'config.json'))
  if old is not None:
    new = json.loads(_config_json(run.config))
    a, b = runner._resumable(old), runner._resumable(new)  # pylint: disable=protected-access
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
  return 'complete', f'finished: {done} rounds' + (f', acc {acc:.4f}' if _finite(acc) else '')


def _first_difference(a: Any, b: Any, prefix: str = '') -> str:
  if isinstance(a, dict) and isinstance(b, dict):
    for k in sorted(set(a) | set(b)):
      if a.get(k) != b.get(k):
        return _first_difference(a.get(k), b.get(k), f'{prefix}{k}.')
  return f'{prefix.rstrip(".")}: {a!r} there, {b!r} now'


def _read_json(path: str) -> Any:
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


# ------------------------------------------------------------ execution
class _Stop(Exception):
  """SIGTERM in the parent: stop like Ctrl-C."""


def _worker_command() -> list[str]:
  return [sys.executable, '-m', 'fedjax_kd.sweep', '--_worker=-']


class _Worker:
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


def _fmt_time(s: float) -> str:
  m, s = divmod(int(round(s)), 60)
  h, m = divmod(m, 60)
  return f'{h}h{m:02d}m{s:02d}s' if h else (f'{m}m{s:02d}s' if m else f'{s}s')


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


def execute(runs: Sequence[Run], jobs: int = 1, log: Callable[[str], None] | None = print,
            compilation_cache: str | None = None) -> list[RunResult]:
  """Runs every run that is not finished yet, up to ``jobs`` worker processes at once.

  Finished runs are skipped, interrupted ones resumed from their newest
  checkpoint (:func:`run_state`). Each run's config goes to
  ``<workdir>/sweep_run.json`` and its output to ``<workdir>/sweep.log``.
  SIGINT/SIGTERM stop the running runs after their current round (they save
  a checkpoint) and start no new ones; a second Ctrl-C aborts them at once.

  Args:
    runs: from :func:`plan`.
    jobs: worker processes at once (>= 1).
    log: where the progress lines go (one per run started, finished,
      skipped or failed); None for silence.
    compilation_cache: the workers' JAX persistent compilation cache directory
      (one of ``compile_cache.OFF``: no cache); None lets each worker choose as
      ``fedjax_kd.main`` does (:func:`fedjax_kd.compile_cache.resolve`).

  Returns:
    A :class:`RunResult` per run, in the order of ``runs``.
  """
  log = log or (lambda s: None)
  jobs = max(1, int(jobs))
  n = len(runs)
  width = len(str(n))
  names = _display_names(runs)
  results: dict[int, RunResult] = {}
  pending = []
  for i, run in enumerate(runs):
    state, note = run_state(run)
    if state == 'complete':
      results[i] = RunResult(run, 'skipped', 0.0, note,
                             _read_json(os.path.join(run.workdir, 'summary.json')))
      log(f'[{i + 1:>{width}}/{n}] skipped  {names[i]}  ({note})')
    elif state == 'diverged':
      results[i] = RunResult(run, 'diverged', 0.0, note)
      log(f'[{i + 1:>{width}}/{n}] diverged {names[i]}  ({note})')
    elif state == 'stale':
      results[i] = RunResult(run, 'failed', 0.0, note)
      log(f'[{i + 1:>{width}}/{n}] FAILED   {names[i]}  {note}')
    else:
      os.makedirs(run.workdir, exist_ok=True)
      workdir_lib.write_json(os.path.join(run.workdir, RUN_FILE),
                             {'label': run.variant.label, 'algorithm': run.variant.algorithm,
                              'cell': [list(p) for p in run.cell], 'seed': run.seed,
                              'config': json.loads(_config_json(run.config))}, indent=2)
      pending.append((i, run, note))
  todo: queue.Queue = queue.Queue()
  for item in _schedule(pending):
    todo.put(item)
  if todo.empty():
    return [results[i] for i in range(n)]

  env = dict(os.environ)
  if compilation_cache is not None:   # the workers' compile_cache.resolve() reads it first
    off = compilation_cache.strip().lower() in compile_cache.OFF
    env[compile_cache.ENV_VAR] = 'none' if off else os.path.abspath(compilation_cache)
  stop = threading.Event()
  events: queue.Queue = queue.Queue()
  lock = threading.Lock()
  workers: list[_Worker] = []

  def slot():
    worker = None
    try:
      while not stop.is_set():
        try:
          i, run, note = todo.get_nowait()
        except queue.Empty:
          break
        if worker is not None and worker.count >= RUNS_PER_WORKER:
          worker.close()
          worker.err.close()
          worker = None
        if worker is None:
          worker = _Worker(env)
          with lock:
            workers.append(worker)
        if stop.is_set():   # stopped while the worker started: leave the run for a rerun
          break
        events.put(('start', i, run, note))
        t0 = time.time()
        answer = worker.ask(os.path.abspath(run.workdir))
        wall = time.time() - t0
        if answer is None:
          code = worker.close()
          tail = worker.stderr_tail()
          worker.err.close()
          worker = None
          status = 'stopped' if stop.is_set() else 'failed'
          result = RunResult(run, status, wall, f'the worker process exited with status {code}; '
                             f'see {os.path.join(run.workdir, LOG_FILE)}'
                             + (f'; it wrote: {tail}' if tail else ''))
        else:
          result = RunResult(run, answer['status'], answer.get('wall_s', wall),
                             answer.get('message', ''), answer.get('summary'))
          if answer['status'] == 'stopped':
            stop.set()
        events.put(('end', i, result, None))
    finally:
      if worker is not None:
        worker.close()
        worker.err.close()
      events.put(('exit', None, None, None))

  threads = [threading.Thread(target=slot, daemon=True) for _ in range(min(jobs, todo.qsize()))]
  old_term = None
  if threading.current_thread() is threading.main_thread():
    def on_term(signum, frame):
      del signum, frame
      raise _Stop
    old_term = signal.signal(signal.SIGTERM, on_term)
  interrupts = 0
  for t in threads:
    t.start()
  live = len(threads)
  try:
    while live:
      try:
        try:
          kind, i, obj, note = events.get(timeout=0.5)
        except queue.Empty:
          continue
        if kind == 'exit':
          live -= 1
        elif kind == 'start':
          extra = f'  ({note})' if note else ''
          log(f'[{i + 1:>{width}}/{n}] start    {names[i]}{extra}')
        else:
          results[i] = obj
          word = {'failed': 'FAILED', 'diverged': 'DIVERGED'}.get(obj.status, obj.status)
          msg = f'  {obj.message}' if obj.message else ''
          log(f'[{i + 1:>{width}}/{n}] {word:<8} {names[i]}  {_fmt_time(obj.wall_s)}{msg}')
      except (KeyboardInterrupt, _Stop) as e:
        interrupts += 1
        signum = signal.SIGTERM if isinstance(e, _Stop) else signal.SIGINT
        stop.set()
        log(f'{signal.Signals(signum).name}: the running runs stop after their current round '
            'and save a checkpoint' + ('' if interrupts == 1 else ' (again: aborting them)'))
        with lock:
          for w in workers:
            w.signal(signum)
  finally:
    if old_term is not None:
      signal.signal(signal.SIGTERM, old_term)
  for i, run in enumerate(runs):
    if i not in results:
      results[i] = RunResult(run, 'stopped', 0.0, 'not started')
  return [results[i] for i in range(n)]


# ------------------------------------------------------------ worker side
def load_run_config(rundir: str) -> ml_collections.ConfigDict:
  """The config a worker runs: ``<rundir>/sweep_run.json``'s ``config``.

  Raises:
    DataError: the file is missing or not valid JSON.
  """
  doc = _read_json(os.path.join(rundir, RUN_FILE))
  if not isinstance(doc, dict) or not isinstance(doc.get('config'), dict):
    raise DataError(f'{rundir} has no readable {RUN_FILE}: is it a sweep run directory?')
  return ml_collections.ConfigDict(doc['config'])


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

  try:
    spec = config_lib.validate(load_run_config(rundir))
    summary = runner.run(spec, rundir, resume=True, progress=False, log=runner_log)
  except (ConfigError, DataError) as e:
    log(f'error: {e}')
    return {'status': 'failed', 'code': 2, 'message': f'error: {e}', 'wall_s': time.time() - t0}
  except DivergenceError as e:
    log(f'error: {e}')
    workdir_lib.write_json(os.path.join(rundir, DIVERGED_FILE),
                           {'round': e.round, 'message': str(e)[:2000]}, indent=2)
    return {'status': 'diverged', 'code': 3, 'message': f'round {e.round}: {str(e)[:300]}',
            'wall_s': time.time() - t0}
  except KeyboardInterrupt:
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
  msg = (f'acc {acc:.4f}' if _finite(acc) else 'acc -') + (
      f'  (resumed after round {summary["rounds"] - summary["rounds_run_this_call"]})'
      if resumed else '')
  return {'status': 'done', 'code': 0, 'message': msg, 'wall_s': wall, 'summary': summary}


def quiet_logs() -> None:
  """Only warnings from JAX, absl and orbax (orbax logs every save at INFO)."""
  import logging  # pylint: disable=g-import-not-at-top

  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  logging.getLogger('jax._src.xla_bridge').setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)   # orbax logs every save at INFO


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
  quiet_logs()
  # Where the sweep chose the cache, $FEDJAX_KD_COMPILATION_CACHE says so (execute()).
  compile_cache.enable(compile_cache.resolve()[0])
  if target != '-':
    def say(s):
      print(s, file=sys.stderr, flush=True)
    return int(run_one(target, say)['code'])
  proto = os.fdopen(os.dup(1), 'w', buffering=1)
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
      proto.write(json.dumps(answer, default=_jsonable) + '\n')
      proto.flush()
      if answer['status'] == 'stopped':
        code = int(answer['code'])
        break
  except KeyboardInterrupt:
    code = 130
  return code


# ------------------------------------------------------------ aggregation
def _finite(v: Any) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def stat(values: Mapping[int, float]) -> dict[str, Any]:
  """Mean and sample standard deviation (ddof=1) of per-seed values.

  Args:
    values: ``{seed: value}``; non-finite and None values are left out.

  Returns:
    ``{'mean', 'std', 'n', 'values'}``; ``std`` is None with fewer than two
    values, ``mean`` is None with none.
  """
  vals = {int(k): float(v) for k, v in values.items() if _finite(v)}
  x = np.array(list(vals.values()), np.float64)
  return {'mean': float(x.mean()) if len(x) else None,
          'std': float(x.std(ddof=1)) if len(x) > 1 else None,
          'n': len(x), 'values': vals}


def headline(rows: Sequence[dict[str, Any]]) -> str:
  """What ``test_acc`` is in these rows: ``'client'`` (the mean of the client
  models, for FD, single, FedCache 2.0, ACE-pFL: their rows log
  ``client_acc_min`` but no ``client_acc``) or ``'server'`` (the server or
  global model)."""
  has_client = any(_finite(r.get('client_acc')) for r in rows)
  return 'client' if not has_client and any('client_acc_min' in r for r in rows) else 'server'


def series(rows: Sequence[dict[str, Any]], metric: str) -> dict[str, np.ndarray]:
  """A run's logged rounds of one metric as arrays (``'test_acc'``, ``'client_acc'``, ...).

  ``'client_acc'`` is ``test_acc`` itself where that is the mean client
  accuracy (:func:`headline`); rows without a finite value (rounds that were
  not evaluated, ``eval.every > 1``) are left out.

  Returns:
    ``{'round', 'acc', 'cum_bytes'}`` (empty arrays when nothing was logged).
  """
  key = metric
  if metric == 'client_acc' and not any(_finite(r.get('client_acc')) for r in rows):
    key = 'test_acc' if headline(rows) == 'client' else None
  keep = [r for r in rows if key and _finite(r.get(key))]
  return {'round': np.array([r['round'] for r in keep], np.int64),
          'acc': np.array([r[key] for r in keep], np.float64),
          'cum_bytes': np.array([r['cum_bytes'] if _finite(r.get('cum_bytes')) else np.nan
                                 for r in keep], np.float64)}


def run_stats(rows: Sequence[dict[str, Any]], summary: dict[str, Any] | None,
              thresholds: Sequence[float], metrics: Sequence[str] = ()) -> dict[str, Any]:
  """One run's numbers (None where the run has none).

  Args:
    rows: its ``metrics.jsonl`` rows.
    summary: its ``summary.json`` (for the wall time when rows lack
      ``round_time_s``).
    thresholds: accuracies for the rounds/bytes-to-threshold numbers (on
      ``test_acc``).
    metrics: row keys whose mean over rounds is reported.

  Returns:
    ``final_acc``, ``best_acc``, ``last10_acc`` (mean of the last 10
    evaluated ``test_acc``), ``final_client_acc``, ``best_client_acc``,
    ``total_bytes``, ``bytes_per_round``, ``rounds``, ``wall_s``,
    ``rounds_to_<x>`` and ``bytes_to_<x>`` per threshold (None if never
    reached), and each extra metric's mean.
  """
  test = series(rows, 'test_acc')
  client = series(rows, 'client_acc')
  out: dict[str, Any] = {
      'final_acc': float(test['acc'][-1]) if len(test['acc']) else None,
      'best_acc': float(test['acc'].max()) if len(test['acc']) else None,
      'last10_acc': float(test['acc'][-10:].mean()) if len(test['acc']) else None,
      'final_client_acc': float(client['acc'][-1]) if len(client['acc']) else None,
      'best_client_acc': float(client['acc'].max()) if len(client['acc']) else None,
      'total_bytes': float(rows[-1]['cum_bytes']) if rows and _finite(rows[-1].get('cum_bytes'))
                     else None,
      'rounds': int(rows[-1]['round']) if rows else None,
  }
  per_round = [r['round_bytes'] for r in rows if _finite(r.get('round_bytes'))]
  out['bytes_per_round'] = float(np.mean(per_round)) if per_round else None
  times = [r['round_time_s'] for r in rows if _finite(r.get('round_time_s'))]
  out['wall_s'] = (float(sum(times)) if times else
                   (summary or {}).get('wall_time_s') if _finite((summary or {}).get('wall_time_s'))
                   else None)
  for x in thresholds:
    hit = np.flatnonzero(test['acc'] >= x)
    out[f'rounds_to_{x:g}'] = int(test['round'][hit[0]]) if len(hit) else None
    b = test['cum_bytes'][hit[0]] if len(hit) else np.nan
    out[f'bytes_to_{x:g}'] = float(b) if np.isfinite(b) else None
  for m in metrics:
    vals = [float(r[m]) for r in rows if _finite(r.get(m))]
    out[m] = float(np.mean(vals)) if vals else None
  return out


def is_complete(summary: dict[str, Any] | None, rounds: int | None) -> bool:
  """Whether a run's ``summary.json`` says it finished ``rounds`` rounds (None: any)."""
  if not summary or summary.get('stopped_by'):
    return False
  return rounds is None or int(summary.get('rounds') or 0) == int(rounds)


def load_plan(out: str) -> dict[str, Any]:
  """A sweep's ``sweep.json``.

  Raises:
    DataError: it is missing or unreadable.
  """
  doc = _read_json(os.path.join(out, PLAN_FILE))
  if not isinstance(doc, dict):
    raise DataError(f'{out} has no readable {PLAN_FILE}: is it a sweep --out directory?')
  return doc


def aggregate(source: str | Sequence[Run], thresholds: Sequence[float] | None = None,
              metrics: Sequence[str] | None = None) -> list[dict[str, Any]]:
  """Mean +- std over seeds of every (variant, grid cell).

  Only finished runs count (``summary.json`` with the planned rounds and no
  ``stopped_by``); the others are listed in ``incomplete``.

  Args:
    source: a sweep's ``--out`` directory (read through its
      ``sweep.json``), or the runs of :func:`plan`.
    thresholds: accuracies for the rounds/bytes-to-threshold numbers;
      default: the plan's ``thresholds``, else the first run's
      ``comm.thresholds``.
    metrics: extra per-round metrics to average; default: the plan's.

  Returns:
    One dict per cell, in plan order: ``variant``, ``algorithm``, ``cell``
    (``{field: value}``), ``cell_label``, ``label`` (variant and cell),
    ``slug``, ``planned`` (seeds planned), ``n`` (finished), ``seeds``,
    ``incomplete`` (seeds not finished), ``diverged`` (``{seed: round}``: runs
    stopped by a non-finite round, not counted in ``n``), ``headline`` (``'server'`` or
    ``'client'``: what ``test_acc`` is), ``thresholds``, ``metrics``,
    ``stats`` (``{key: stat(...)}`` for every key of :func:`run_stats`),
    ``reached`` (``{'<x>': (k, n)}``: seeds reaching each threshold) and
    ``curves`` (``{seed: {metric: series}}`` for ``'test_acc'``, ``'client_acc'``
    and each of ``metrics``).
  """
  if isinstance(source, (str, os.PathLike)):
    doc = load_plan(str(source))
    entries = [{'variant': e['variant'], 'algorithm': e.get('algorithm', ''),
                'cell': [tuple(p) for p in e.get('cell', [])], 'seed': int(e['seed']),
                'workdir': os.path.join(str(source), e['workdir']), 'rounds': e.get('rounds')}
               for e in doc.get('runs', [])]
    if thresholds is None:
      thresholds = doc.get('thresholds')
    if metrics is None:
      metrics = doc.get('metrics')
  else:
    entries = [{'variant': r.variant.label, 'algorithm': r.variant.algorithm, 'cell': list(r.cell),
                'seed': r.seed, 'workdir': r.workdir, 'rounds': r.rounds} for r in source]
    if thresholds is None and source:
      thresholds = tuple(source[0].config.comm.thresholds)
  metrics = tuple(metrics or ())
  thresholds = tuple(float(x) for x in (thresholds or ()))
  cells: dict[tuple, dict[str, Any]] = {}
  per_seed: dict[tuple, dict[int, dict[str, Any]]] = {}
  for e in entries:
    key = (e['variant'], json.dumps(e['cell'], default=_jsonable))
    if key not in cells:
      cell = dict(e['cell'])
      label = e['variant'] + (f' ({cell_label(e["cell"])})' if cell else '')
      cells[key] = {'variant': e['variant'], 'algorithm': e['algorithm'], 'cell': cell,
                    'cell_label': cell_label(e['cell']), 'label': label,
                    'slug': slug(e['variant']) + (f'_{cell_slug(e["cell"])}' if cell else ''),
                    'planned': 0, 'seeds': [], 'incomplete': [], 'diverged': {},
                    'headline': None,
                    'thresholds': list(thresholds), 'metrics': list(metrics), 'curves': {}}
      per_seed[key] = {}
    c = cells[key]
    c['planned'] += 1
    wd = e['workdir']
    summary = _read_json(os.path.join(wd, 'summary.json'))
    if not is_complete(summary, e['rounds']) or not os.path.exists(
        os.path.join(wd, workdir_lib.METRICS)):
      div = read_diverged(wd)
      if div is not None:
        c['diverged'][e['seed']] = div.get('round')
      else:
        c['incomplete'].append(e['seed'])
      continue
    rows = workdir_lib.read_metrics(wd)
    c['seeds'].append(e['seed'])
    c['headline'] = c['headline'] or headline(rows)
    per_seed[key][e['seed']] = run_stats(rows, summary, thresholds, metrics)
    c['curves'][e['seed']] = {m: series(rows, m) for m in ('test_acc', 'client_acc') + metrics}
  out = []
  for key, c in cells.items():
    runs = per_seed[key]
    keys = [k for k, _, _ in BASE_STATS] + [f'{p}_{x:g}' for x in thresholds
                                            for p in ('rounds_to', 'bytes_to')] + list(metrics)
    c['stats'] = {k: stat({s: r.get(k) for s, r in runs.items()}) for k in keys}
    c['n'] = len(runs)
    c['reached'] = {f'{x:g}': (c['stats'][f'rounds_to_{x:g}']['n'], c['n']) for x in thresholds}
    out.append(c)
  return out


# ------------------------------------------------------------ formatting
def fmt_stat(s: dict[str, Any] | None, kind: str = 'acc') -> str:
  """``'0.600 ± 0.100'``; ``'0.600 ± –'`` for one seed; ``'–'`` for none.

  Args:
    s: a :func:`stat` dict.
    kind: ``'acc'`` (3 decimals), ``'bytes'`` (MB, 2 decimals), ``'kbytes'``
      (kB, 1 decimal) or ``'num'`` (1 decimal).
  """
  if not s or s.get('mean') is None:
    return '–'
  scale, digits = {'acc': (1.0, 3), 'bytes': (MB, 2), 'kbytes': (1e3, 1),
                   'num': (1.0, 1)}[kind]
  std = '–' if s.get('std') is None else f'{s["std"] / scale:.{digits}f}'
  return f'{s["mean"] / scale:.{digits}f} ± {std}'


def _columns(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]
             ) -> list[tuple[str, str, str]]:
  cols = [c for c in BASE_STATS
          if any(cell['stats'].get(c[0], {}).get('n') for cell in cells)
          or c[0] in ('final_acc', 'best_acc')]
  for x in thresholds:
    cols.append((f'rounds_to_{x:g}', f'rounds to {x:g}', 'num'))
    cols.append((f'bytes_to_{x:g}', f'MB to {x:g}', 'bytes'))
  metrics = []
  for cell in cells:
    metrics += [m for m in cell.get('metrics', []) if m not in metrics]
  cols += [(m, f'mean {m}', 'num4') for m in metrics]
  return cols


def format_column(cell: dict[str, Any], key: str, kind: str) -> str:
  """A cell's statistic as table text; ``rounds_to_<x>`` adds ``(k/n)``; kind ``'num4'``
  (extra metrics) gives 3 decimals, none from 1000 up."""
  s = cell['stats'].get(key)
  if kind == 'num4':
    if not s or s.get('mean') is None:
      return '–'
    digits = 0 if abs(s['mean']) >= 1000 else 3
    std = '–' if s.get('std') is None else f'{s["std"]:.{digits}f}'
    return f'{s["mean"]:.{digits}f} ± {std}'
  text = fmt_stat(s, kind)
  if key.startswith('rounds_to_'):
    k, n = cell['reached'][key[len('rounds_to_'):]]
    text = f'{text} ({k}/{n})' if k else f'– (0/{n})'
  return text


def markdown_table(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> str:
  """The cells as a markdown table (mean ± std over seeds; n = finished seeds)."""
  fields: list[str] = []
  for c in cells:
    fields += [f for f in c['cell'] if f not in fields]
  cols = _columns(cells, thresholds)
  head = ['variant'] + fields + ['n'] + [h for _, h, _ in cols]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for c in cells:
    n = f'{c["n"]}' if c['n'] == c['planned'] else f'{c["n"]} of {c["planned"]}'
    vals = [c['variant']] + [show_value(c['cell'][f]) if f in c['cell'] else '' for f in fields]
    vals += [n] + [format_column(c, k, kind) for k, _, kind in cols]
    lines.append('| ' + ' | '.join(v.replace('|', '\\|') for v in vals) + ' |')
  return '\n'.join(lines)


def csv_text(cells: Sequence[dict[str, Any]], thresholds: Sequence[float]) -> str:
  """The cells as CSV: ``<stat>_mean`` and ``<stat>_std`` columns (std 0 when n = 1).

  Also ``n``, ``planned`` and ``reached_<x>`` (``'k/n'``); grid fields get a
  column each.
  """
  fields: list[str] = []
  for c in cells:
    fields += [f for f in c['cell'] if f not in fields]
  cols = _columns(cells, thresholds)
  header = ['variant', 'algorithm'] + fields + ['n', 'planned']
  for k, _, _ in cols:
    header += [f'{k}_mean', f'{k}_std']
  header += [f'reached_{x:g}' for x in thresholds]
  buf = io.StringIO()
  w = csv.writer(buf, lineterminator='\n')
  w.writerow(header)
  for c in cells:
    row = [c['variant'], c['algorithm']] + [show_value(c['cell'][f]) if f in c['cell'] else ''
                                            for f in fields] + [c['n'], c['planned']]
    for k, _, _ in cols:
      s = c['stats'].get(k) or {}
      mean = s.get('mean')
      row += ['' if mean is None else repr(mean),
              '' if mean is None else repr(s['std'] if s.get('std') is not None else 0.0)]
    row += ['{}/{}'.format(*c['reached'][f'{x:g}']) for x in thresholds]
    w.writerow(row)
  return buf.getvalue()


# ------------------------------------------------------------ figures
def _band(curves: Sequence[dict[str, np.ndarray]]) -> tuple[np.ndarray, ...]:
  """Rounds, mean cum bytes, mean and std of accuracy over the seeds logging each round."""
  rounds = sorted(set(int(r) for s in curves for r in s['round']))
  acc = np.full((len(curves), len(rounds)), np.nan)
  byt = np.full_like(acc, np.nan)
  pos = {r: j for j, r in enumerate(rounds)}
  for i, s in enumerate(curves):
    for r, a, b in zip(s['round'], s['acc'], s['cum_bytes']):
      acc[i, pos[int(r)]] = a
      byt[i, pos[int(r)]] = b
  with np.errstate(all='ignore'), _no_warnings():
    mean = np.nanmean(acc, axis=0)
    n = np.sum(np.isfinite(acc), axis=0)
    std = np.where(n > 1, np.nanstd(acc, axis=0, ddof=1), 0.0)
    b = np.nanmean(byt, axis=0)
  return np.array(rounds), b, mean, np.nan_to_num(std)


class _no_warnings:
  def __enter__(self):
    import warnings  # pylint: disable=g-import-not-at-top
    self._ctx = warnings.catch_warnings()
    self._ctx.__enter__()
    warnings.simplefilter('ignore', RuntimeWarning)

  def __exit__(self, *exc):
    return self._ctx.__exit__(*exc)


def legend_label(cell: dict[str, Any], metric: str) -> str:
  """``'DS-FL ERA — server test acc'``: the cell and what its curve is."""
  if metric == 'client_acc':
    what = 'mean client acc'
  else:
    what = 'mean client test acc' if cell.get('headline') == 'client' else 'server test acc'
  return f'{cell["label"]} — {what}'


def figure_accuracy(cells: Sequence[dict[str, Any]], metric: str = 'test_acc',
                    title: str = '') -> Any:
  """Mean accuracy (%) with a ±std band over seeds, against the round and the bytes.

  Args:
    cells: from :func:`aggregate`.
    metric: ``'test_acc'`` or ``'client_acc'`` (:func:`series`).
    title: the figure's title (default: the metric's name).

  Returns:
    A :class:`matplotlib.figure.Figure` (not registered with pyplot) with two
    axes: accuracy vs round and vs cumulative communication (MB, log scale;
    cells that send nothing are left out of it); only the first when no cell
    logs bytes (e.g. a reference implementation that counts none); None when
    no cell has the metric.
  """
  from matplotlib import ticker  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top

  from fedjax_kd.plot import run_color  # pylint: disable=g-import-not-at-top
  drawn = []
  for i, c in enumerate(cells):
    curves = [cv[metric] for cv in c['curves'].values() if len(cv[metric]['round'])]
    if curves:
      drawn.append((i, c, _band(curves)))
  if not drawn:
    return None
  many = len(drawn) > 6
  any_bytes = any(np.any(np.isfinite(b) & (b > 0)) for _, _, (_, b, _, _) in drawn)
  fig = Figure(figsize=((13.0 if any_bytes else 7.0) + (3.0 if many else 0.0), 4.8),
               layout='constrained')
  ax_r, ax_b = fig.subplots(1, 2) if any_bytes else (fig.subplots(1, 1), None)
  name = METRIC_NAMES[metric]
  for i, c, (rounds, b, mean, std) in drawn:
    color = run_color(i)
    label = legend_label(c, metric)
    marker = 'o' if len(rounds) <= 30 else None
    ax_r.plot(rounds, mean * 100, color=color, label=label, marker=marker, markersize=3,
              linewidth=1.5)
    lo, hi = np.clip(mean - std, 0, 1) * 100, np.clip(mean + std, 0, 1) * 100
    ax_r.fill_between(rounds, lo, hi, color=color, alpha=0.2,
                      linewidth=0)
    keep = np.isfinite(b) & (b > 0)
    if keep.any():
      ax_b.plot(b[keep] / MB, mean[keep] * 100, color=color, label=label, marker=marker,
                markersize=3, linewidth=1.5)
      ax_b.fill_between(b[keep] / MB, lo[keep], hi[keep],
                        color=color, alpha=0.2, linewidth=0)
  ax_r.set_xlabel('round')
  ax_r.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  for ax in (ax_r, ax_b) if any_bytes else (ax_r,):
    ax.set_ylabel(f'{name} (%), mean ± std over seeds')
    ax.grid(True, alpha=0.35)
  if any_bytes:
    ax_b.set_xscale('log')
    lo, hi = ax_b.get_xlim()
    span = hi / lo if lo > 0 else math.inf
    labelled = set(range(2, 10)) if span < 10 else {2, 5} if span < 100 else set()

    def minor(v, _):
      lead = int(round(v / 10 ** math.floor(math.log10(v) + 1e-9))) if v > 0 else 0
      return f'{v:g}' if lead in labelled else ''

    ax_b.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f'{v:g}'))
    ax_b.xaxis.set_minor_formatter(ticker.FuncFormatter(minor))
    ax_b.set_xlabel('cumulative communication (MB, log scale)')
    ax_b.set_title(f'{title or name} vs communication', fontsize='medium')
  ax_r.set_title(f'{title or name} vs round', fontsize='medium')
  handles, labels = ax_r.get_legend_handles_labels()
  if many:
    fig.legend(handles, labels, loc='outside right upper', fontsize='small', frameon=False)
  else:
    ax_r.legend(loc='best', fontsize='small', framealpha=0.85)
  return fig


def save_figure(fig: Any, path: str) -> str:
  """Saves with the Agg canvas (any backend is left alone) and closes the figure."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  FigureCanvasAgg(fig)
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)   # a no-op for figures pyplot does not manage
  return path


def write_figures(prefix: str, cells: Sequence[dict[str, Any]], title: str = '') -> dict[str, str]:
  """``<prefix>test_acc.png`` and, where any cell has client accuracy, ``<prefix>client_acc.png``.

  Returns:
    ``{metric: path}`` of the files written; ``{}`` without matplotlib (the ``plot`` extra).
  """
  out = {}
  if importlib.util.find_spec('matplotlib') is None:
    return out
  for metric in ('test_acc', 'client_acc'):
    if metric == 'client_acc' and not any(
        _finite(r) for c in cells for cv in c['curves'].values()
        for r in cv['client_acc']['acc']):
      continue
    fig = figure_accuracy(cells, metric, title)
    if fig is not None:
      out[metric] = save_figure(fig, f'{prefix}{metric}.png')
  return out


def write_outputs(out_dir: str, cells: Sequence[dict[str, Any]],
                  thresholds: Sequence[float] | None = None, title: str = '') -> dict[str, str]:
  """Writes ``compare.csv``, ``compare.md`` and the accuracy figures into ``out_dir``.

  Args:
    out_dir: the sweep's directory.
    cells: from :func:`aggregate`.
    thresholds: the rounds/bytes-to-threshold columns (default: the cells').
    title: a heading for ``compare.md`` and the figures.

  Returns:
    ``{'csv', 'md', 'test_acc'[, 'client_acc']}``: the paths written.
  """
  if thresholds is None:
    thresholds = cells[0]['thresholds'] if cells else ()
  thresholds = tuple(float(x) for x in thresholds)
  os.makedirs(out_dir, exist_ok=True)
  paths = {'csv': os.path.join(out_dir, 'compare.csv'),
           'md': os.path.join(out_dir, 'compare.md')}
  workdir_lib.write_text(paths['csv'], csv_text(cells, thresholds))
  plan_doc = _read_json(os.path.join(out_dir, PLAN_FILE)) or {}
  lines = [f'# {title or "Sweep"}', '']
  if plan_doc.get('config'):
    lines.append(f'Config: `{plan_doc["config"]}`' + (
        f'; overrides: `{_overrides_text(plan_doc.get("overrides"))}`'
        if plan_doc.get('overrides') else ''))
  seeds = sorted({s for c in cells for s in c['seeds'] + c['incomplete']})
  lines += [f'Seeds: {", ".join(map(str, seeds))}. Values are mean ± sample std over the '
            'finished seeds (n); "–" = undefined (one seed) or never reached. acc = the '
            "algorithm's test_acc (server model; mean client model for FD, single, FedCache "
            '2.0, ACE-pFL); client acc = mean client-model accuracy; rounds/MB to x: first '
            'evaluated round with acc >= x, over the seeds that reached it (k/n).', '',
            markdown_table(cells, thresholds), '']
  diverged = diverged_lines(cells)
  if diverged:
    lines += ['Diverged (a round left NaN or Inf; not in n): ' + '; '.join(diverged) + '.', '']
  figs = write_figures(os.path.join(out_dir, 'accuracy_'), cells, title)
  for metric, path in figs.items():
    lines.append(f'![{metric}]({os.path.basename(path)})')
  if not figs and importlib.util.find_spec('matplotlib') is None:
    lines.append("(No figures: matplotlib is not installed; pip install 'fedjax_kd[plot]'.)")
  paths.update(figs)
  workdir_lib.write_text(paths['md'], '\n'.join(lines).rstrip() + '\n')
  return paths


def _overrides_text(overrides: Any) -> str:
  if isinstance(overrides, dict):
    return ' '.join(f'{k}={show_value(v)}' for k, v in overrides.items())
  return str(overrides)


# ------------------------------------------------------------ CLI parsing
def split_top_level(text: str, sep: str) -> list[str]:
  """Splits at ``sep`` outside brackets, parentheses, braces and quotes.

  ``"('a','b'),('c',)"`` split at ``','`` gives ``["('a','b')", "('c',)"]``.
  """
  parts, depth, quote, start = [], 0, '', 0
  for i, ch in enumerate(text):
    if quote:
      if ch == quote:
        quote = ''
    elif ch in '\'"':
      quote = ch
    elif ch in '([{':
      depth += 1
    elif ch in ')]}':
      depth = max(0, depth - 1)
    elif ch == sep and depth == 0:
      parts.append(text[start:i])
      start = i + 1
  parts.append(text[start:])
  return parts


def parse_value(text: str) -> Any:
  """A Python literal (``ast.literal_eval``), else the text itself as a string."""
  text = text.strip()
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
    return text


def parse_set(items: Sequence[str]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
  """``--set`` flags: single-valued fields (overrides) and multi-valued ones (the grid).

  Raises:
    ConfigError: an item is not ``field=value[,value...]`` or names a field twice.
  """
  overrides: dict[str, Any] = {}
  grid: dict[str, list[Any]] = {}
  for item in items:
    field, eq, text = item.partition('=')
    field = field.strip()
    if not eq or not field or not text.strip():
      raise ConfigError('--set', item, 'field=value or field=value1,value2,...')
    if field in overrides or field in grid:
      raise ConfigError('--set', item, f'each field once ({field} is given twice)')
    values = [parse_value(v) for v in split_top_level(text, ',') if v.strip()]
    if len(values) == 1:
      overrides[field] = values[0]
    else:
      grid[field] = values
  return overrides, grid


def parse_variant(text: str) -> Variant:
  """``'LABEL=ALGORITHM[;field=value;...]'`` (``ALGORITHM`` alone: labelled by it).

  The label is everything before the last ``=`` of the first part, so labels
  may contain ``=`` (``'fixed T = T0=acepfl;acepfl.dynamic_temperature=False'``).

  Raises:
    ConfigError: a part is not ``field=value``.
  """
  parts = split_top_level(text, ';')
  head = parts[0].strip()
  label, eq, algorithm = head.rpartition('=')
  label, algorithm = (label.strip(), algorithm.strip()) if eq else (head, head)
  if not algorithm or not label:
    raise ConfigError('--variant', text, "'LABEL=ALGORITHM[;field=value;...]'")
  fields = {}
  for part in parts[1:]:
    if not part.strip():
      continue
    field, eq, value = part.partition('=')
    if not eq or not field.strip():
      raise ConfigError('--variant', text, "'LABEL=ALGORITHM[;field=value;...]'")
    fields[field.strip()] = parse_value(value)
  return Variant(label, algorithm, fields)


def _ints(text: str, flag: str) -> list[int]:
  try:
    return [int(v) for v in text.split(',') if v.strip()]
  except ValueError:
    raise ConfigError(flag, text, 'comma-separated integers, e.g. 0,1,2') from None


def _floats(text: str, flag: str) -> list[float]:
  try:
    return [float(v) for v in text.split(',') if v.strip()]
  except ValueError:
    raise ConfigError(flag, text, 'comma-separated accuracies, e.g. 0.8,0.9') from None


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog='python -m fedjax_kd.sweep', description=__doc__.split('\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--config', help='config file with get_config() (PATH[:ARG])')
  p.add_argument('--algorithms', default='', help='comma-separated; a variant each')
  p.add_argument('--variant', action='append', default=[],
                 help="'LABEL=ALGORITHM[;field=value;...]' (repeatable)")
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--set', action='append', default=[], dest='sets',
                 help='field=value (every run) or field=v1,v2,... (a grid axis); repeatable')
  p.add_argument('--out', default='runs/sweep')
  p.add_argument('--jobs', type=int, default=1, help='worker processes at once')
  p.add_argument('--thresholds', default='', help="default: the config's comm.thresholds")
  p.add_argument('--metrics', default='', help='per-round metrics averaged over rounds')
  p.add_argument('--compilation_cache', default=None,
                 help="JAX persistent compilation cache directory (off, none, false or '': "
                      'no cache; default: $FEDJAX_KD_COMPILATION_CACHE, else '
                      '$JAX_COMPILATION_CACHE_DIR, else ~/.cache/fedjax_kd/jax_cache)')
  p.add_argument('--dry_run', action='store_true', help='print the plan and exit')
  p.add_argument('--_worker', default=None, help=argparse.SUPPRESS)
  return p


def describe(runs: Sequence[Run]) -> str:
  """The plan as text: one line per run with its workdir and fields."""
  lines = []
  for r in runs:
    pairs = list(r.variant.fields.items()) + list(r.cell)
    fields = ' '.join(f'{k}={show_value(v)}' for k, v in pairs)
    lines.append(f'  {r.workdir}  {fields} seed={r.seed}')
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; returns the exit status."""
  args = _parser().parse_args(argv)
  if args._worker is not None:   # pylint: disable=protected-access
    return worker_main(args._worker)   # pylint: disable=protected-access
  quiet_logs()
  try:
    if not args.config:
      raise ConfigError('--config', None, 'a config file, e.g. --config=configs/default.py')
    base = config_lib.load_file(args.config)
    overrides, grid = parse_set(args.sets)
    variants = [Variant(a.strip(), a.strip()) for a in args.algorithms.split(',') if a.strip()]
    variants += [parse_variant(v) for v in args.variant]
    if not variants:
      variants = [Variant(str(base.algorithm), str(base.algorithm))]
    seeds = _ints(args.seeds, '--seeds')
    if not seeds:
      raise ConfigError('--seeds', args.seeds, 'at least one seed')
    runs = plan(base, variants, seeds, grid, args.out, overrides)
    thresholds = (_floats(args.thresholds, '--thresholds') if args.thresholds
                  else [float(x) for x in runs[0].config.comm.thresholds])
    metrics = [m.strip() for m in args.metrics.split(',') if m.strip()]
    cache, source = compile_cache.resolve(args.compilation_cache)
    compile_cache.check(cache, source)
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  cells = len(list(itertools.product(*grid.values()))) if grid else 1
  print(f'sweep: {len(variants)} variant(s) x {cells} grid cell(s) x {len(seeds)} seed(s) = '
        f'{len(runs)} runs in {args.out}', flush=True)
  if args.dry_run:
    print(describe(runs))
    return 0
  write_plan(args.out, runs, config=args.config, overrides=overrides, thresholds=thresholds,
             metrics=metrics)
  if cache is not None and not compile_cache.writable(cache):   # one warning, here
    cache = None
  t0 = time.time()
  results = execute(runs, jobs=args.jobs, log=lambda s: print(s, flush=True),
                    compilation_cache=cache or 'none')
  counts = {k: sum(r.status == k for r in results) for k in ('done', 'skipped', 'diverged',
                                                             'failed', 'stopped')}
  cells_out = aggregate(args.out)
  paths = write_outputs(args.out, cells_out, thresholds, title=f'Sweep of {args.config}')
  print(f'sweep: {counts["done"]} done, {counts["skipped"]} skipped, {counts["failed"]} failed'
        + (f', {counts["diverged"]} diverged (NaN/Inf; kept as results)'
           if counts['diverged'] else '')
        + (f', {counts["stopped"]} stopped' if counts['stopped'] else '')
        + f' in {_fmt_time(time.time() - t0)}; '
        + ', '.join(os.path.relpath(p, args.out) for p in paths.values()) + f' in {args.out}',
        flush=True)
  if counts['failed']:
    for r in results:
      if r.status == 'failed':
        print(f'failed: {r.run.name}: {r.message}', file=sys.stderr)
    return 1
  if counts['stopped']:
    return stopped_status(results)
  return 0


def stopped_status(results: Sequence[RunResult]) -> int:
  """128 + the signal that stopped the sweep: 143 for SIGTERM, else 130 (SIGINT)."""
  term = any((r.summary or {}).get('stopped_by') == 'SIGTERM' for r in results)
  return 128 + (signal.SIGTERM if term else signal.SIGINT).value


def entry() -> None:
  """The ``fedjax-kd-sweep`` console script (``python -m fedjax_kd.sweep`` does the same)."""
  sys.exit(main())


if __name__ == '__main__':
  entry()
