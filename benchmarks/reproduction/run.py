"""``run``: plans the chosen sweeps, runs what is not finished (fedjax_kd's runs in worker
processes, the PyTorch references and the SCARLET authors' code after them) and writes each
sweep's outputs (:func:`cmd_run`).
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import subprocess
import sys
from typing import Sequence

from benchmarks.reproduction.defs import MNIST_DEFAULT, REPO, SKIPPED, SweepDef, torch_ref
from benchmarks.reproduction.plan import Planned, command_line, commit, plan_sweep
from benchmarks.reproduction.sections import select
from fedjax_kd import sweep
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import executors

def cmd_run(args: argparse.Namespace, argv: Sequence[str]) -> int:
  """Plans every chosen sweep, runs what is not finished, writes each sweep's outputs."""
  mnist = args.mnist or MNIST_DEFAULT
  planned: list[Planned] = []
  skipped: list[tuple[SweepDef, str]] = []
  try:
    where = executors.options_from(args)
    sections = select(args.only)
    names = [n.strip() for n in args.sweeps.split(',') if n.strip()]
    unknown = sorted(set(names) - {d.name for s in sections for d in s.sweeps})
    if unknown:
      raise ConfigError('--sweeps', ','.join(unknown), 'sweep names of the chosen sections')
    for section in sections:
      for d in section.sweeps:
        if names and d.name not in names:
          continue
        if args.data != 'all' and d.data != args.data:
          skipped.append((d, f'not run yet (`run --data={d.data}` runs it)'))
          continue
        p = plan_sweep(section, d, args.runs, mnist, args.tiny,
                       (args.scarlet_python, args.scarlet_checkout))
        if isinstance(p, str):
          skipped.append((d, p))
        else:
          planned.append(p)
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  for d, why in skipped:
    if os.path.exists(os.path.join(args.runs, d.name, sweep.PLAN_FILE)):
      why = 'not selected; its earlier outputs are kept'
    print(f'{d.name}: skipped: {why}', flush=True)
  if args.dry_run:
    for p in planned:
      seeds = ','.join(str(x) for x in dict.fromkeys(r.seed for r in p.runs))
      print(f'{p.sweep.name}: {len(p.runs)} runs, seeds {seeds} -> {p.out}')
    print(f'reproduction: {sum(len(p.runs) for p in planned)} runs planned, every config valid')
    return 0
  for d, why in skipped:   # the report says why (a sweep run before keeps its outputs)
    if os.path.exists(os.path.join(args.runs, d.name, sweep.PLAN_FILE)):
      continue
    os.makedirs(os.path.join(args.runs, d.name), exist_ok=True)
    workdir_lib.write_json(os.path.join(args.runs, d.name, SKIPPED), {'reason': why}, indent=2)
  for p in planned:
    marker = os.path.join(p.out, SKIPPED)
    if os.path.exists(marker):
      os.remove(marker)
  meta = {'tiny': bool(args.tiny), 'command': command_line(argv), 'commit': commit(),
          'date': datetime.date.today().isoformat()}
  for p in planned:
    sweep.write_plan(p.out, p.runs, config=p.sweep.config or p.sweep.preset_text,
                     overrides=p.overrides, thresholds=list(p.thresholds),
                     metrics=list(p.sweep.metrics), engine=p.sweep.engine,
                     meta={**meta, 'section': p.section.key, 'sweep': p.sweep.name})
  if args.plan_only:   # the runs were made, or are being made, by other processes
    print(f'reproduction: wrote the plans of {len(planned)} sweeps; nothing run', flush=True)
    return 0
  keep = {v.strip() for v in args.variants.split(',') if v.strip()}
  chosen = lambda p: [r for r in p.runs if not keep or r.variant.label in keep]
  runs = [r for p in planned if p.sweep.engine == 'fedjax_kd' for r in chosen(p)]
  torch_runs = [(p.sweep.torch_module, r) for p in planned if p.sweep.engine == 'torch'
                for r in chosen(p)]
  print(f'reproduction: {len(planned)} sweeps, {len(runs) + len(torch_runs)} runs in '
        f'{args.runs}', flush=True)
  try:
    results = executors.execute(runs, where, jobs=args.jobs, log=lambda s: print(s, flush=True),
                                compilation_cache=os.path.join(args.runs, 'jax_cache'),
                                home=args.runs)
  except (ConfigError, DataError) as e:   # the executor cannot start: nothing ran
    print(f'error: {e}', file=sys.stderr)
    return 2
  if torch_runs:   # one after the other in this process: PyTorch uses every core itself
    results += run_torch(torch_runs, args.torch_threads)
  for p in planned:
    if p.sweep.engine == 'scarlet_official':
      results += run_official(p, args.scarlet_python, args.scarlet_checkout, mnist)
  for p in planned:
    cells = sweep.aggregate(p.out)
    sweep.write_outputs(p.out, cells, p.thresholds, title=f'{p.section.paper}: {p.sweep.name}')
  failed = [r for r in results if r.status == 'failed']
  stopped = [r for r in results if r.status == 'stopped']
  print(f'reproduction: {sum(r.status == "done" for r in results)} done, '
        f'{sum(r.status == "skipped" for r in results)} skipped, {len(failed)} failed'
        + (f', {n_div} diverged (kept as results)'
           if (n_div := sum(r.status == 'diverged' for r in results)) else '')
        + (f', {len(stopped)} stopped' if stopped else ''), flush=True)
  for r in failed:
    print(f'failed: {r.run.workdir}: {r.message}', file=sys.stderr)
  return 1 if failed else sweep.stopped_status(results) if stopped else 0


def run_official(p: 'Planned', python: str, checkout: str, mnist: str
                 ) -> list[sweep.RunResult]:
  """Runs the SCARLET authors' code for a sweep's unfinished runs (one process; the driver
  skips finished runs) and reports each run as :func:`sweep.execute` does."""
  rounds = {r.rounds for r in p.runs}
  cmd = [python, os.path.join(REPO, 'benchmarks', 'references', 'scarlet_official.py'),
         f'--checkout={checkout}', f'--mnist={mnist}',
         '--seeds=' + ','.join(str(s) for s in dict.fromkeys(r.seed for r in p.runs)),
         '--algorithms=' + ','.join(dict.fromkeys(r.variant.algorithm for r in p.runs)),
         '--model=' + str(p.runs[0].config.server.model).partition('@')[0],
         f'--rounds={rounds.pop()}', '--threads=1', f'--out={p.out}']
  print('reproduction: ' + ' '.join(shlex.quote(c) for c in cmd), flush=True)
  start = datetime.datetime.now()
  rc = subprocess.run(cmd, check=False).returncode
  wall = (datetime.datetime.now() - start).total_seconds()
  out = []
  for r in p.runs:
    summary = workdir_lib.read_json(r.workdir, 'summary.json')
    done = sweep.is_complete(summary, r.rounds)
    out.append(sweep.RunResult(r, 'done' if done else 'failed', wall / len(p.runs),
                               f'acc {summary["final_acc"]:.4f}' if done else
                               f'the driver exited {rc}; see {r.workdir}', summary))
  return out


def run_torch(runs: Sequence[tuple[str, sweep.Run]], threads: int = 0
              ) -> list[sweep.RunResult]:
  """Runs the PyTorch references' ``(module, run)`` pairs (finished ones are skipped) as
  :func:`sweep.execute` reports its own; ``threads``: PyTorch's threads (0: its default)."""
  ref = torch_ref()
  out = []
  for module, r in runs:
    state = 'skipped' if sweep.is_complete(workdir_lib.read_json(r.workdir, 'summary.json'),
                                           r.rounds) else 'done'
    start = datetime.datetime.now()
    try:
      (summary,) = ref.common.execute(ref.load(module), [r], threads,
                                      log=lambda s: print(s, flush=True))
    except Exception as e:  # pylint: disable=broad-except
      out.append(sweep.RunResult(r, 'failed', message=f'{type(e).__name__}: {e}'))
      continue
    if 'diverged' in summary:
      out.append(sweep.RunResult(r, 'diverged', message=f'round {summary["diverged"]}'))
      continue
    if 'error' in summary:   # another process holds the run
      out.append(sweep.RunResult(r, 'failed', message=summary['error']))
      continue
    out.append(sweep.RunResult(r, state, (datetime.datetime.now() - start).total_seconds(),
                               f'acc {summary["final_acc"]:.4f}', summary))
  return out
