r"""Runs several algorithms on the same data, seed and clients; prints a markdown table.

  python benchmarks/compare_algorithms.py --preset=digits --out=runs/compare_digits
  python benchmarks/compare_algorithms.py --preset=mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/compare_mnist

Columns: final and best test accuracy (DS-FL and FedAvg: the server/global
model; FD and single: the mean over client models), the mean client accuracy,
cumulative communication (DS-FL paper rules, incl. the one-time open-data
broadcast), ComU@x (bytes until accuracy x is first reached) and wall time.
"""

from __future__ import annotations

import argparse
import os

from fedjax_kd import config as config_lib
from fedjax_kd import presets, runner

RUNS = {
    'DS-FL (ERA, T=0.1)': ('dsfl', {'dsfl.aggregation': 'era'}),
    'DS-FL (SA)': ('dsfl', {'dsfl.aggregation': 'sa'}),
    'FD': ('fd', {}),
    'FedAvg': ('fedavg', {}),
    'Single client': ('single', {}),
}


def make(preset: str, algorithm: str, source: str | None):
  if preset == 'digits':
    c = presets.digits(algorithm)
  else:
    c = presets.dsfl_paper_cpu(source or 'tfds:mnist')
    c.algorithm = algorithm
    if algorithm == 'fedavg':
      c.clients.models = ['cnn@1.0']
  return c


def _set(c, field: str, value):
  node = c
  *path, last = field.split('.')
  for p in path:
    node = node[p]
  node[last] = value


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--preset', choices=('digits', 'mnist_cpu'), default='digits')
  p.add_argument('--source', default=None)
  p.add_argument('--rounds', type=int, default=0)
  p.add_argument('--only', default='', help='semicolon-separated subset of the run names')
  p.add_argument('--out', default='runs/compare')
  args = p.parse_args()
  rows = []
  for name, (algorithm, overrides) in RUNS.items():
    if args.only and name not in args.only.split(';'):
      continue
    c = make(args.preset, algorithm, args.source)
    for k, v in overrides.items():
      _set(c, k, v)
    if args.rounds:
      c.rounds = args.rounds
    c.checkpoint.every = 0
    spec = config_lib.validate(c)
    workdir = os.path.join(args.out, algorithm + '_' + '_'.join(
        str(v) for v in overrides.values()))
    s = runner.run(spec, workdir, resume=False, progress=False)
    rows.append((name, s, spec))
    print(f'{name}: {s["final_acc"]:.4f}', flush=True)
  thresholds = rows[0][2].comm_thresholds
  head = ('| method | final acc | best acc | mean client acc | cum. comm | '
          + ' | '.join(f'ComU@{x:g}' for x in thresholds) + ' | wall |')
  print('\n' + head)
  print('|' + '---|' * (head.count('|') - 1))
  mb = lambda b: '-' if b is None else f'{b / 1e6:.2f} MB'
  for name, s, spec in rows:
    client = s['final_client_acc']
    print(f'| {name} | {s["final_acc"]:.3f} | {s["top_acc"]:.3f} | '
          f'{"-" if client is None else f"{client:.3f}"} | {mb(s["cum_bytes"])} | '
          + ' | '.join(mb(s[f'comu@{x:g}']) for x in thresholds)
          + f' | {s["wall_time_s"]:.0f} s |')
  print(f'\n{rows[0][2].rounds} rounds, seed {rows[0][2].seed}, {rows[0][2].num_clients} clients.')


if __name__ == '__main__':
  main()
