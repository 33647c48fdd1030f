r"""The reproduction report: fixed multi-seed sweeps per paper and a report from their outputs.

  python -m benchmarks.reproduction run --runs=runs/repro --jobs=2 \
      [--only=dsfl,scarlet] [--data=all|digits|mnist] [--mnist=/path/to/mnist.npz] \
      [--tiny] [--dry_run] [--sweeps=NAME,...]
  python -m benchmarks.reproduction archive --runs=runs/repro --out=benchmarks/results/reproduction_runs
  python -m benchmarks.reproduction report --runs=benchmarks/results/reproduction_runs \
      --out=docs/reproduction.md --results=benchmarks/results [--readme=README.md] \
      [--only=...] [--tiny]
  python -m benchmarks.reproduction standing --runs=benchmarks/results/reproduction_runs [--replay]
  python -m benchmarks.reproduction compact --runs=benchmarks/results/reproduction_runs

``run`` plans every sweep of the chosen sections
(:data:`benchmarks.reproduction.sections.SECTIONS`), validates every run's config before
anything trains, and runs them with :mod:`fedjax_kd.sweep` (worker processes, ``--jobs``
at once): rerunning it
skips finished runs and resumes interrupted ones. Each sweep's outputs
(``sweep.json``, ``compare.csv``, ``compare.md``, figures, one workdir per
run) go to ``<runs>/<sweep name>``. A sweep on MNIST needs ``--mnist``, a
Keras-layout ``mnist.npz`` (default ``$FEDJAX_KD_MNIST``); without the file it is
skipped and the report says so.

``report`` reads those outputs only (re-aggregating each sweep from its
workdirs) and writes the markdown: a headline table with one row per check
(paper, claim, our numbers, verdict), then per paper its claim, the commands,
a table per sweep (mean ± sample std over the finished seeds), the figures
(written to ``<results>/figures/reproduction/<sweep>_*.png``, ``--results`` defaulting to
the report's folder; linked with relative paths), the checks with their verdicts and notes. No
measured number in it is typed by hand: they all come from the runs' files.

``archive`` copies what ``report`` reads (each sweep's plan, each finished run's
config, summary and metrics; no checkpoints) to a directory small enough to
commit, one ``<sweep>.tar.gz`` per sweep with a ``MANIFEST.sha256``
(:mod:`benchmarks.reproduction.archive`): the report is rebuilt from it, and a copy of it
given to ``run`` is unpacked in place, skips the finished runs and starts the rest.
``compact`` converts an archive of plain sweep folders to that form in place.

``--tiny`` shrinks every sweep to a smoke test (2 rounds, 4 clients, a small
MLP on the ``synthetic`` source, one seed, fewer variants and grid values, no
MNIST sweeps) so the whole pipeline runs in about a minute; its numbers mean
nothing.

``standing`` ties each archived run to today's code (:mod:`benchmarks.reproduction.standing`);
``report`` leaves out the runs it cannot tie.

Editing: each paper's variants, seeds, grids, checks and notes are in its module under
:mod:`benchmarks.reproduction.papers`; the shared seeds and tiny settings in
:mod:`benchmarks.reproduction.defs`; :data:`benchmarks.reproduction.sections.SECTIONS` lists the
papers.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from typing import Any, Callable, Sequence

from benchmarks.reproduction import standing as standing_lib
from benchmarks.reproduction import archive as archive_lib
from benchmarks.reproduction.archive import ARCHIVE_DEFAULT, ARCHIVE_MARKER, archive
from benchmarks.reproduction.plan import commit
from benchmarks.reproduction.report import cmd_report
from benchmarks.reproduction.run import cmd_run
from benchmarks.reproduction.sections import SECTIONS, sweep_engines
from fedjax_kd import sweep
from fedjax_kd.errors import DataError
from fedjax_kd.running import workdir as workdir_lib
from fedjax_kd.sweep import executors


def cmd_standing(args: argparse.Namespace) -> int:
  """Ties the archive's stale runs to today's code; prints what stays stale."""
  sweeps = sweep_engines()
  only = set(filter(None, args.sweeps.split(',')))
  if only - set(sweeps):
    print(f'error: --sweeps: unknown {", ".join(sorted(only - set(sweeps)))}', file=sys.stderr)
    return 2
  if args.replay:
    sweep.quiet_logs()
  try:
    counts = standing_lib.tie(args.runs, sweeps, args.replay,
                              only=lambda r: not only or r.sweep in only)
    stale = standing_lib.stale_runs(args.runs, sweeps)
  except DataError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'standing: tied {counts}; {len(stale)} run(s) stale')
  for path, why in sorted(stale.items()):
    print(f'  {path}: {why}')
  return 0


def _on_runs(args: argparse.Namespace, fn: Callable[[str], Any]) -> tuple[Any, int]:
  """``(fn(args.runs), 0)``; ``(None, 2)`` after one error line when ``--runs`` is not a
  folder or its files are refused."""
  if not os.path.isdir(args.runs):
    print(f'error: --runs: {args.runs} is not a directory', file=sys.stderr)
    return None, 2
  try:
    return fn(args.runs), 0
  except DataError as e:
    print(f'error: {e}', file=sys.stderr)
    return None, 2


def cmd_archive(args: argparse.Namespace) -> int:
  """Copies the finished runs' small files to ``--out`` and marks it an archive."""
  counts, code = _on_runs(args, lambda runs: archive(runs, args.out))
  if code:
    return code
  n_sweeps, n_runs = counts
  workdir_lib.write_json(os.path.join(args.out, ARCHIVE_MARKER),
                         {'from': args.runs, 'runs': n_runs, 'sweeps': n_sweeps,
                          'commit': commit(), 'date': datetime.date.today().isoformat()},
                         indent=2)
  print(f'archived {n_runs} finished runs of {n_sweeps} sweeps to {args.out}')
  return 0


def cmd_compact(args: argparse.Namespace) -> int:
  """Converts a plain archive to one tar per sweep and a manifest, in place."""
  names, code = _on_runs(args, archive_lib.compact)
  if code:
    return code
  print(f'compacted {len(names)} sweep folder(s) of {args.runs} into '
        f'<sweep>{archive_lib.SUFFIX} and {archive_lib.MANIFEST}')
  return 0


def unpack_runs(runs: str) -> int:
  """A copy of a compact archive given to ``run`` becomes a runs folder (in place)."""
  if not archive_lib.is_compact(runs):
    return 0
  if os.path.realpath(runs) == os.path.realpath(os.path.join(standing_lib.REPO, ARCHIVE_DEFAULT)):
    print(f'error: --runs={runs} is the committed archive: runs go to a copy of it '
          f'(cp -r {ARCHIVE_DEFAULT} runs/repro) and are archived after', file=sys.stderr)
    return 2
  try:
    names = archive_lib.unpack(runs)
  except DataError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'unpacked {len(names)} sweep(s) of the archive copy {runs}', flush=True)
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  """``run`` or ``report``; returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest='command', required=True)
  r = sub.add_parser('run', help='run (or resume) the sweeps')
  r.add_argument('--runs', default='runs/repro', help='where the sweeps go')
  r.add_argument('--only', default='', help='comma-separated section keys: '
                 + ','.join(s.key for s in SECTIONS))
  r.add_argument('--jobs', type=int, default=1,
                 help='worker processes at once (--executor=local)')
  executors.add_flags(r)
  r.add_argument('--mnist', default='', help='Keras mnist.npz (default $FEDJAX_KD_MNIST)')
  r.add_argument('--tiny', action='store_true', help='a smoke test of the pipeline')
  r.add_argument('--data', default='all', choices=('all', 'digits', 'mnist'),
                 help='run only the sweeps on this data set (the others are marked not run)')
  r.add_argument('--dry_run', action='store_true', help='plan and validate only')
  r.add_argument('--plan_only', action='store_true',
                 help="write each sweep's plan (sweep.json) and run nothing")
  r.add_argument('--scarlet_checkout', default='',
                 help="a clone of the SCARLET authors' repository (branch main) for "
                 'scarlet_mnist_official')
  r.add_argument('--scarlet_python', default='',
                 help="a Python with the authors' dependencies and fedjax_kd "
                 '(docs/scarlet_official.md)')
  r.add_argument('--torch_threads', type=int, default=0,
                 help="PyTorch's threads for the reference runs (0: its default; 1 when the "
                 'cores are shared: its thread pool slows down badly when oversubscribed)')
  r.add_argument('--sweeps', default='', help='comma-separated sweep names: run only these '
                 '(of the chosen sections; the others are left as they are)')
  r.add_argument('--variants', default='', help='comma-separated variant labels: run only '
                 "these variants' runs (the plans still list every run; the others are left "
                 'as they are)')
  q = sub.add_parser('report', help='write the markdown from the outputs')
  q.add_argument('--runs', default='runs/repro')
  q.add_argument('--out', default='docs/reproduction.md')
  q.add_argument('--only', default='')
  q.add_argument('--mnist', default='')
  q.add_argument('--tiny', action='store_true')
  q.add_argument('--readme', default='',
                 help='also rewrite the headline block of this README (between its markers)')
  q.add_argument('--results', default='',
                 help="the folder of the report's artefacts: its figures go to "
                      "<results>/figures/reproduction and it reads the lock-step table's "
                      "<results>/authors_lockstep.json (default: the report's folder)")
  a = sub.add_parser('archive', help='copy the finished runs\' small files (the report\'s '
                     'inputs) to a directory that can be committed')
  a.add_argument('--runs', default='runs/repro')
  a.add_argument('--out', default=ARCHIVE_DEFAULT)
  t = sub.add_parser('standing', help='tie each archived run to today\'s code (by its '
                     'commit\'s golden record, its reference\'s source, or a replay of its first '
                     'round) and write <runs>/standing.json')
  t.add_argument('--runs', default=ARCHIVE_DEFAULT)
  t.add_argument('--replay', action='store_true',
                 help='replay the first round of runs no record ties (one per group)')
  t.add_argument('--sweeps', default='', help='comma-separated sweep names (default: all)')
  c = sub.add_parser('compact', help='convert an archive of plain sweep folders to one '
                     '<sweep>.tar.gz per sweep and MANIFEST.sha256, in place')
  c.add_argument('--runs', default=ARCHIVE_DEFAULT)
  args = p.parse_args(argv)
  if args.command == 'archive':
    return cmd_archive(args)
  if args.command == 'compact':
    return cmd_compact(args)
  if args.command == 'standing':
    return cmd_standing(args)
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  sweep.quiet_logs()
  if args.command == 'run':
    return unpack_runs(args.runs) or cmd_run(args, argv)
  return cmd_report(args, argv)
