"""``archive``: the small files of finished runs that ``report`` reads and ``run`` needs to
skip them, copied to a directory that can be committed (:func:`archive`).
"""

from __future__ import annotations

import os
import shutil

from benchmarks.repro.defs import SKIPPED
from fedjax_kd import sweep
from fedjax_kd import workdir as workdir_lib

ARCHIVE_DEFAULT = 'docs/reproduction_runs'
ARCHIVE_MARKER = 'archive.json'   # written by `archive`: the report then says how to add runs
ARCHIVED_SWEEP_FILES = (sweep.PLAN_FILE, SKIPPED)
ARCHIVED_RUN_FILES = ('config.json', 'summary.json', workdir_lib.METRICS, 'sweep_run.json',
                      sweep.DIVERGED_FILE)


def archive(runs: str, out: str) -> tuple[int, int]:
  """Copies what ``report`` reads, and what ``run`` needs to skip a finished run.

  Per sweep its plan (or skip marker); per finished or diverged run its config,
  summary, metrics, run record and divergence record, at the same relative
  paths. ``report --runs=<out>`` then writes the same tables, and ``run --runs=<copy of out>`` skips those
  runs and starts only the rest. Checkpoints, event files and figures stay
  behind (they are large and rebuilt when needed).

  Returns:
    ``(sweeps, runs)`` copied.
  """
  n_sweeps = n_runs = 0
  for name in sorted(os.listdir(runs)):
    src = os.path.join(runs, name)
    if not any(os.path.exists(os.path.join(src, f)) for f in ARCHIVED_SWEEP_FILES):
      continue
    n_sweeps += 1
    os.makedirs(os.path.join(out, name), exist_ok=True)
    for f in ARCHIVED_SWEEP_FILES:
      if os.path.exists(os.path.join(src, f)):
        shutil.copyfile(os.path.join(src, f), os.path.join(out, name, f))
    if not os.path.exists(os.path.join(src, sweep.PLAN_FILE)):
      continue
    for entry in sweep.load_plan(src).get('runs', []):
      wd = os.path.join(src, entry['workdir'])
      if not (sweep.is_complete(workdir_lib.read_json(wd, 'summary.json'), entry.get('rounds'))
              or sweep.read_diverged(wd) is not None):
        continue
      dst = os.path.join(out, name, entry['workdir'])
      os.makedirs(dst, exist_ok=True)
      for f in ARCHIVED_RUN_FILES:
        if os.path.exists(os.path.join(wd, f)):
          shutil.copyfile(os.path.join(wd, f), os.path.join(dst, f))
      n_runs += 1
  return n_sweeps, n_runs
