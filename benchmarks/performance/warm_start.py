r"""Warm start: seconds from launching ``python -m fedjax_kd.main`` until round 1 trains.

  python benchmarks/performance/warm_start.py --repeats=5 [--config=configs/default.py] [--out=F.json]

One cold run fills a fresh compilation cache (in a temporary folder), then ``--repeats`` warm
runs of the same one-round command load their programs from it. Per run:

* ``wall``: the process's wall time, launch to exit;
* ``compile``: round 1's ``compile_s`` in ``metrics.jsonl`` (tracing, lowering and loading its
  programs from the cache);
* ``ready``: ``wall`` less round 1's training (``round_time_s - compile_s``): everything the run
  spends before and around its first round's work. It also holds the final summary and the
  process's exit, so it overstates the launch-to-training time a little.

The table gives the median over the warm runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from fedjax_kd.running import workdir as workdir_lib

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def one_run(config: str, workdir: str, cache: str) -> dict[str, float]:
  """Runs one round of ``config``; returns its wall, compile and ready seconds."""
  env = dict(os.environ, FEDJAX_KD_COMPILATION_CACHE=cache)
  cmd = [sys.executable, '-m', 'fedjax_kd.main', f'--config={config}', '--config.rounds=1',
         f'--workdir={workdir}', '--noprogress']
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f'error: {" ".join(cmd)} exited {proc.returncode}:\n'
                     f'{(proc.stdout + proc.stderr)[-2000:]}')
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    row = json.loads(f.readline())
  train = row['round_time_s'] - row['compile_s']
  return {'wall_s': wall, 'compile_s': row['compile_s'], 'ready_s': wall - train}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--config', default=os.path.join(REPO, 'configs', 'default.py'))
  p.add_argument('--repeats', type=int, default=5, help='warm runs after the cold one')
  p.add_argument('--out', default='', help='write the runs as JSON here')
  a = p.parse_args(argv)
  if a.repeats < 1:
    print('error: --repeats must be >= 1', file=sys.stderr)
    return 2
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, 'jax_cache')
    cold = one_run(a.config, os.path.join(tmp, 'cold'), cache)
    print(f'cold: wall {cold["wall_s"]:.2f} s, ready {cold["ready_s"]:.2f} s', flush=True)
    warm = []
    for i in range(a.repeats):
      warm.append(one_run(a.config, os.path.join(tmp, f'warm{i}'), cache))
      print(f'warm {i + 1}: wall {warm[-1]["wall_s"]:.2f} s, round-1 compile '
            f'{warm[-1]["compile_s"]:.2f} s, ready {warm[-1]["ready_s"]:.2f} s', flush=True)
  lines = [f'| measure (warm, median of {a.repeats}) | seconds | runs |', '|---|---|---|']
  for key, name in (('ready_s', 'launch to round-1 training (ready)'),
                    ('compile_s', 'round 1 tracing, lowering, loading'), ('wall_s', 'wall')):
    vals = [r[key] for r in warm]
    lines.append(f'| {name} | {statistics.median(vals):.2f} | '
                 f'{", ".join(f"{v:.2f}" for v in vals)} |')
  print('\n'.join(lines))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    workdir_lib.write_json(a.out, {'config': a.config, 'cold': cold, 'warm': warm}, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
