r"""What running a sweep through Ray costs against the local executor, on this machine.

  python benchmarks/performance/cluster_overhead.py --repeats=3 --out=benchmarks/results/cluster_overhead.json
  python benchmarks/performance/cluster_overhead.py --from_json=benchmarks/results/cluster_overhead.json \
      --markdown=docs/cluster.md

The same sweep of 8 tiny runs (the default config at its tests' smallest settings: 2
algorithms x 4 seeds, 2 rounds) runs as a whole command, fresh ``--out`` each time:

* ``local``: ``--executor=local --jobs=N``;
* ``ray``: ``--executor=ray`` on a Ray cluster started here beforehand (``N`` nodes of one CPU
  each, ``benchmarks/performance/local_clusters.py``), so that both run ``N`` runs at once.

Both commands run in the cluster's network namespace (only ``lo``, as root), so that they
differ in the executor alone.

Repeats alternate local and Ray, after one warm-up sweep of each that fills the compilation
cache both then use, as a user's second sweep would. A sweep's time is the command's wall
time, from start to exit, connecting to the cluster and its storage check included (the
cluster's own start is not: it is started once, as a cluster is). The table gives the medians
and their ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import config_costs  # pylint: disable=g-import-not-at-top,wrong-import-position
import local_clusters  # pylint: disable=g-import-not-at-top,wrong-import-position

SETS = ('rounds=2', "clients.models=('mlp@0.25',)", 'server.model=mlp@0.25',
        'clients.num_clients=4', 'train.epochs=1', 'distill.epochs=1',
        'data.source=synthetic:300', 'data.num_public=60', 'distill.public_per_round=30',
        'distill.batch_size=30', 'log.tensorboard=False')
BEGIN, END = '<!-- cluster-overhead:begin -->', '<!-- cluster-overhead:end -->'


def sweep_seconds(out: str, executor: list[str], cache: str, algorithms: str, seeds: str,
                  wrap=None) -> float:
  """The wall time of one whole sweep command (run through ``wrap``, if given: a cluster's
  namespace)."""
  cmd = [sys.executable, '-m', 'fedjax_kd.sweep', '--config=configs/default.py',
         f'--algorithms={algorithms}', f'--seeds={seeds}', f'--out={out}',
         f'--compilation_cache={cache}', *executor]
  for s in SETS:
    cmd += ['--set', s]
  if wrap is not None:
    cmd = wrap(cmd, REPO)
  t0 = time.perf_counter()
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f'error: {" ".join(cmd)} exited {proc.returncode}:\n{proc.stdout[-1500:]}'
                     f'\n{proc.stderr[-1500:]}')
  return wall


def measure(a: argparse.Namespace) -> dict:
  runs = len(a.algorithms.split(',')) * len(a.seeds.split(','))
  with tempfile.TemporaryDirectory(prefix='fedjax_kd_overhead_') as folder:
    cluster = local_clusters.start_ray(os.path.join(folder, 'ray'), nodes=a.jobs, cpus=1)
    try:
      cache = os.path.join(folder, 'jax_cache')
      # Both in the cluster's namespace (only lo), so that they differ in the executor alone.
      kinds = {'local': ['--executor=local', f'--jobs={a.jobs}'],
               'ray': ['--executor=ray', f'--ray_address={cluster.address}']}
      times: dict[str, list[float]] = {k: [] for k in kinds}
      for r in range(-1, a.repeats):   # -1: the warm-up sweeps, not kept
        for kind, flags in kinds.items():
          t = sweep_seconds(os.path.join(folder, f'{kind}{r}'), flags, cache, a.algorithms,
                            a.seeds, cluster.wrap)
          print(f'{kind} {"warm-up" if r < 0 else f"repeat {r + 1}"}: {t:.1f} s',
                file=sys.stderr, flush=True)
          if r >= 0:
            times[kind].append(t)
    finally:
      cluster.stop()
  local, ray = statistics.median(times['local']), statistics.median(times['ray'])
  return {'runs': runs, 'jobs': a.jobs, 'machine': config_costs.machine(), 'local_s': local,
          'ray_s': ray, 'ratio': ray / local, 'times': times}


def table(doc: dict) -> str:
  """The markdown of a saved ``--out`` document."""
  runs = lambda k: ', '.join(f'{x:.1f}' for x in doc['times'][k])
  return '\n'.join([
      f'{doc["runs"]} tiny runs, {doc["jobs"]} at a time, on {doc["machine"]}: a whole sweep '
      f'command, median of {len(doc["times"]["local"])} (after a warm-up of each)',
      '', '| executor | a sweep | against local | the sweeps |', '|---|---|---|---|',
      f'| `local --jobs={doc["jobs"]}` | {doc["local_s"]:.1f} s | 1.00x | {runs("local")} s |',
      f'| `ray` ({doc["jobs"]} nodes of 1 CPU) | {doc["ray_s"]:.1f} s | {doc["ratio"]:.2f}x | '
      f'{runs("ray")} s |'])


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--jobs', type=int, default=2, help='runs at once (Ray: nodes of 1 CPU)')
  ap.add_argument('--algorithms', default='dsfl,single')
  ap.add_argument('--seeds', default='0,1,2,3')
  ap.add_argument('--out', default='')
  ap.add_argument('--from_json', default='', help='the table of a saved --out file')
  ap.add_argument('--markdown', default='',
                  help=f'write the table between {BEGIN} and {END} of this file')
  a = ap.parse_args(argv)
  try:
    return config_costs.table_main(a, measure, table, BEGIN, END)
  except local_clusters.Unavailable as e:
    print(f'error: {e}', file=sys.stderr)
    return 2


if __name__ == '__main__':
  sys.exit(main())
