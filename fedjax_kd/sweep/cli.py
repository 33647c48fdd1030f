"""``python -m fedjax_kd.sweep``: flags, ``--set``/``--variant`` parsing, and the command.

Part of :mod:`fedjax_kd.sweep` (its docstring documents the flags).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import os
import sys
import time
from typing import Any, Sequence


from fedjax_kd import config as config_lib
from fedjax_kd.errors import ConfigError, DataError, DiskFullError
from fedjax_kd.running import compile_cache
from fedjax_kd.running import results
from fedjax_kd.sweep import executors
from fedjax_kd.sweep.collect import aggregate
from fedjax_kd.sweep.planning import Run, Variant, plan, show_value, write_plan
from fedjax_kd.sweep.report import write_outputs
from fedjax_kd.sweep.workers import quiet_logs, stopped_status, worker_main

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
      prog='python -m fedjax_kd.sweep',
      description='Multi-seed sweeps: variants x grid cells x seeds, run in worker processes, '
                  'summarised (the guide: help(fedjax_kd.sweep)).',
      formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--config', help='config file with get_config() (PATH[:ARG])')
  p.add_argument('--algorithms', default='', help='comma-separated; a variant each')
  p.add_argument('--variant', action='append', default=[],
                 help="'LABEL=ALGORITHM[;field=value;...]' (repeatable)")
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--set', action='append', default=[], dest='sets',
                 help='field=value (every run) or field=v1,v2,... (a grid axis); repeatable')
  p.add_argument('--out', default='runs/sweep')
  p.add_argument('--jobs', type=int, default=1,
                 help='worker processes at once (--executor=local; a cluster runs as many as '
                      'its resources allow)')
  p.add_argument('--thresholds', default='', help="default: the config's comm.thresholds")
  p.add_argument('--metrics', default='', help='per-round metrics averaged over rounds')
  p.add_argument('--compilation_cache', default=None,
                 help="JAX persistent compilation cache directory (off, none, false or '': "
                      'no cache; default: $FEDJAX_KD_COMPILATION_CACHE, else '
                      '$JAX_COMPILATION_CACHE_DIR, else ~/.cache/fedjax_kd/jax_cache)')
  p.add_argument('--dry_run', action='store_true', help='print the plan and exit')
  executors.add_flags(p)
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
    runs = plan(base, variants, seeds, grid, args.out, overrides, config_file=args.config)
    thresholds = (_floats(args.thresholds, '--thresholds') if args.thresholds
                  else [float(x) for x in runs[0].config.comm.thresholds])
    metrics = [m.strip() for m in args.metrics.split(',') if m.strip()]
    cache, source = compile_cache.resolve(args.compilation_cache)
    compile_cache.check(cache, source)
    where = executors.options_from(args)
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  cells = len(list(itertools.product(*grid.values()))) if grid else 1
  print(f'sweep: {len(variants)} variant(s) x {cells} grid cell(s) x {len(seeds)} seed(s) = '
        f'{len(runs)} runs in {args.out}', flush=True)
  if args.dry_run:
    print(describe(runs))
    return 0
  if cache is not None and not compile_cache.writable(cache):   # one warning, here
    cache = None
  t0 = time.time()
  try:   # the sweep's own files: a full disk or an unreadable run is one line, not a traceback
    write_plan(args.out, runs, config=args.config, overrides=overrides, thresholds=thresholds,
               metrics=metrics)
    outcome = executors.execute(runs, where, jobs=args.jobs,
                                log=lambda s: print(s, flush=True),
                                compilation_cache=cache or 'none', home=args.out)
    cells_out = aggregate(args.out)
    paths = write_outputs(args.out, cells_out, thresholds, title=f'Sweep of {args.config}')
  except (ConfigError, DiskFullError, DataError) as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    return 2
  counts = {k: sum(r.status == k for r in outcome) for k in ('done', 'skipped', 'diverged',
                                                             'failed', 'stopped', 'submitted')}
  print(f'sweep: {counts["done"]} done, {counts["skipped"]} skipped, {counts["failed"]} failed'
        + (f', {counts["diverged"]} diverged (NaN/Inf; kept as outcome)'
           if counts['diverged'] else '')
        + (f', {counts["stopped"]} stopped' if counts['stopped'] else '')
        + (f', {counts["submitted"]} left to SLURM (rerun to collect)'
           if counts['submitted'] else '')
        + f' in {results.fmt_time(time.time() - t0)}; '
        + ', '.join(os.path.relpath(p, args.out) for p in paths.values()) + f' in {args.out}',
        flush=True)
  if counts['failed']:
    for r in outcome:
      if r.status == 'failed':
        print(f'failed: {r.run.name}: {r.message}', file=sys.stderr)
    return 1
  if counts['stopped']:
    return stopped_status(outcome)
  return 0


def entry() -> None:
  """The ``fedjax-kd-sweep`` console script (``python -m fedjax_kd.sweep`` does the same)."""
  sys.exit(main())
