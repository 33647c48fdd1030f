r"""Runs several algorithms on the same data, seed and clients; prints a markdown table.

  python benchmarks/compare_algorithms.py --preset=digits --out=runs/compare_digits
  python benchmarks/compare_algorithms.py --preset=mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/compare_mnist
  python benchmarks/compare_algorithms.py --preset=scarlet_digits
  python benchmarks/compare_algorithms.py --preset=scarlet_mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/scarlet_mnist
  python benchmarks/compare_algorithms.py --preset=fedcache2_digits
  python benchmarks/compare_algorithms.py --preset=fedcache2_mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/fc2_mnist
  python benchmarks/compare_algorithms.py --preset=acepfl_digits --out=runs/ace_digits
  python benchmarks/compare_algorithms.py --preset=acepfl_mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/ace_mnist

The DS-FL presets (``digits``, ``mnist_cpu``) compare DS-FL, FD, FedAvg and a
single client under the DS-FL paper's byte rules (incl. the one-time open-data
broadcast). The SCARLET presets compare SCARLET with DS-FL on the same seed
(the authors' round order and byte rules) and, with ``--only`` or ``--all``,
CFD, COMET, Selective-FD (with and without the cache), Individual and
Centralized. The FedCache 2.0 presets compare FedCache 2.0, DS-FL and a single
client on the same private data and per-client test splits: every run carves
the same public set from the training data, which only DS-FL uses.

Columns: final and best test accuracy (DS-FL, SCARLET and the other public-set
methods: the server model; FD and single: the mean over client models), the
mean client accuracy, cumulative communication, its ratio to the first row,
ComU@x (bytes until accuracy x is first reached) and wall time. The FedCache 2.0
table reports UA (the mean of the clients' personalised test accuracies) for
every method, DS-FL's server accuracy beside it.

The ACE-pFL presets run ACE-pFL, one ablation per component (clustering off,
fixed temperature, double and single distillation), per-cluster teachers, the
spec's renormalised top-K rows (A8), FedMD-style mean aggregation (without and
with the public-label CE), DS-FL and a single client, all on the same seed,
partition, labelled public set and per-client test splits, bytes under the
``acepfl`` rules. The table reports UA (the mean personalised test accuracy).
"""

from __future__ import annotations

import argparse
import json
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
SCARLET_RUNS = {
    'SCARLET': ('scarlet', {}),
    'DS-FL (ERA)': ('dsfl', {}),
    'CFD': ('cfd', {}),
    'COMET': ('comet', {}),
    'Selective-FD': ('selective_fd', {}),
    'CFD + cache': ('cfd', {'cache.mode': 'on'}),
    'COMET + cache': ('comet', {'cache.mode': 'on'}),
    'Selective-FD + cache': ('selective_fd', {'cache.mode': 'on'}),
    'Individual': ('individual', {}),
    'Centralized': ('centralized', {}),
}
SCARLET_DEFAULT = ('SCARLET', 'DS-FL (ERA)')
FEDCACHE2_RUNS = {
    'FedCache 2.0': ('fedcache2', {}),
    'DS-FL (ERA)': ('dsfl', {}),
    'Single client': ('single', {}),
}
ACEPFL_RUNS = {
    'ACE-pFL': ('acepfl', {}),
    'w/o clustering': ('acepfl', {'acepfl.clustering': False}),
    'fixed T = T0': ('acepfl', {'acepfl.dynamic_temperature': False}),
    'double (no L_GD)': ('acepfl', {'acepfl.distillation': 'double'}),
    'single (L_CE + L_KD)': ('acepfl', {'acepfl.distillation': 'single'}),
    'per-cluster teachers': ('acepfl', {'acepfl.aggregation': 'per_cluster'}),
    'top-K renormalised (A8)': ('acepfl', {'acepfl.renormalize': 'client'}),
    'public CE only (no KD terms)': ('acepfl', {'acepfl.weights': [0.4, 0.0, 0.0, 0.0]}),
    'FedMD-style mean': ('fedmd', {}),
    'FedMD-style mean + public CE': ('fedmd', {'fedmd.public_ce': 0.4}),
    'DS-FL (ERA)': ('dsfl', {}),
    'Single client': ('single', {}),
}
# Public set carved from the training data for every run (only DS-FL uses it), per-round sample.
_FC2_PUBLIC = {'fedcache2_digits': (400, 300), 'fedcache2_mnist_cpu': (3000, 500)}


def make(preset: str, algorithm: str, source: str | None):
  if preset == 'digits':
    c = presets.digits(algorithm)
  elif preset.startswith('fedcache2'):
    c = presets.fedcache2_cpu('digits' if preset == 'fedcache2_digits'
                              else (source or 'tfds:mnist'))
    c.algorithm = algorithm
    c.data.num_public, c.distill.public_per_round = _FC2_PUBLIC[preset]
  elif preset.startswith('acepfl'):
    c = presets.acepfl_cpu('digits' if preset == 'acepfl_digits' else (source or 'tfds:mnist'),
                           algorithm)
  elif preset.startswith('scarlet'):
    source = 'digits' if preset == 'scarlet_digits' else (source or 'tfds:mnist')
    c = presets.scarlet_cpu(source, algorithm)
  else:
    c = presets.dsfl_paper_cpu(source or 'tfds:mnist')
    c.algorithm = algorithm
    if algorithm == 'fedavg':
      c.clients.models = ['cnn@1.0']
  return c


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--preset', choices=('digits', 'mnist_cpu', 'scarlet_digits',
                                      'scarlet_mnist_cpu', 'fedcache2_digits',
                                      'fedcache2_mnist_cpu', 'acepfl_digits',
                                      'acepfl_mnist_cpu'), default='digits')
  p.add_argument('--all', action='store_true', help='SCARLET presets: every baseline')
  p.add_argument('--source', default=None)
  p.add_argument('--rounds', type=int, default=0)
  p.add_argument('--only', default='', help='semicolon-separated subset of the run names')
  p.add_argument('--out', default='runs/compare')
  args = p.parse_args()
  rows = []
  scarlet = args.preset.startswith('scarlet')
  fc2 = args.preset.startswith('fedcache2')
  ace = args.preset.startswith('acepfl')
  runs = (SCARLET_RUNS if scarlet else FEDCACHE2_RUNS if fc2 else ACEPFL_RUNS if ace
          else RUNS)
  only = args.only.split(';') if args.only else (
      list(SCARLET_DEFAULT) if scarlet and not args.all else list(runs))
  for name, (algorithm, overrides) in runs.items():
    if name not in only:
      continue
    c = make(args.preset, algorithm, args.source)
    config_lib.override(c, overrides)
    if args.rounds:
      c.rounds = args.rounds
    c.checkpoint.every = 0
    spec = config_lib.validate(c)
    workdir = os.path.join(args.out, algorithm + '_' + '_'.join(
        f'{k.split(".")[-1]}-{v}' for k, v in overrides.items()).replace(' ', ''))
    s = runner.run(spec, workdir, resume=False, progress=False)
    rows.append((name, s, spec, workdir))
    print(f'{name}: {s["final_acc"]:.4f}', flush=True)
  if fc2 or ace:
    print_ua_table(rows)
    return
  thresholds = rows[0][2].comm_thresholds
  head = ('| method | final acc | best acc | mean client acc | cum. comm | vs first | '
          + ' | '.join(f'ComU@{x:g}' for x in thresholds) + ' | wall |')
  print('\n' + head)
  print('|' + '---|' * (head.count('|') - 1))
  mb = lambda b: '-' if b is None else f'{b / 1e6:.2f} MB'
  first = rows[0][1]['cum_bytes']
  for name, s, spec, _ in rows:
    client = s['final_client_acc']
    ratio = f'{s["cum_bytes"] / first:.3f}' if first else '-'
    print(f'| {name} | {s["final_acc"]:.3f} | {s["top_acc"]:.3f} | '
          f'{"-" if client is None else f"{client:.3f}"} | {mb(s["cum_bytes"])} | {ratio} | '
          + ' | '.join(mb(s[f'comu@{x:g}']) for x in thresholds)
          + f' | {s["wall_time_s"]:.0f} s |')
  print(f'\n{rows[0][2].rounds} rounds, seed {rows[0][2].seed}, {rows[0][2].num_clients} clients, '
        f'byte rules: {rows[0][1]["comm_rules"]}.')


def print_ua_table(rows):
  """UA (mean personalised client accuracy) table for the FedCache 2.0 presets."""
  print('\n| method | final UA | best UA (round) | server acc | cum. comm | '
        + ' | '.join(f'ComU@{x:g}' for x in rows[0][2].comm_thresholds) + ' | wall |')
  print('|' + '---|' * (6 + len(rows[0][2].comm_thresholds)))
  mb = lambda b: '-' if b is None else f'{b / 1e6:.2f} MB'
  for name, s, spec, workdir in rows:
    with open(os.path.join(workdir, 'metrics.jsonl')) as f:
      evals = [r for r in map(json.loads, f) if r.get('test_acc') is not None]
    ua = [r.get('client_acc', r['test_acc']) for r in evals]
    best = max(range(len(ua)), key=ua.__getitem__)
    server = f'{s["final_acc"]:.3f}' if spec.algorithm == 'dsfl' else '-'
    comu = [next((r['cum_bytes'] for r, a in zip(evals, ua) if a >= x), None)
            for x in spec.comm_thresholds]
    print(f'| {name} | {ua[-1]:.3f} | {ua[best]:.3f} ({evals[best]["round"]}) | {server} | '
          f'{mb(s["cum_bytes"])} | ' + ' | '.join(mb(b) for b in comu)
          + f' | {s["wall_time_s"]:.0f} s |')
  spec = rows[0][2]
  rules = rows[0][1]['comm_rules']
  print(f'\n{spec.rounds} rounds, seed {spec.seed}, {spec.num_clients} clients, Dirichlet '
        f'alpha {spec.data.alpha}, per-client test splits; byte rules: '
        + ('each algorithm\'s own.' if spec.comm_rules == 'paper' else f'{rules} for all.'))


if __name__ == '__main__':
  main()
