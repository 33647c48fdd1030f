r"""Random vs FedEntOpt client selection, trained, on the same partitions and seeds.

For every (setting, algorithm, selection, seed) it runs the experiment and
records, per round, the global model's test accuracy, the number of labels the
cohort covers and the entropy (bits) of the cohort's summed label counts. It
writes ``per_round.csv`` (one row per run and round) and ``summary.md`` under
``--out`` and prints the summary table: the paper's metric (mean test accuracy
over the last 10 rounds; mean +- sample std over seeds), the best accuracy, the
mean label coverage, the share of rounds whose cohort holds every label, and
the mean cohort entropy.

  python benchmarks/fedentopt_compare.py --preset=digits --out=runs/fe_digits
  python benchmarks/fedentopt_compare.py --preset=mnist_cpu \
      --source=npz:../shared/data/mnist.npz --out=runs/fe_mnist
  python benchmarks/fedentopt_compare.py --preset=paper --source=tfds:cifar10 \
      --settings=dir0.1,c2 --algorithms=fedavg,fedprox,scaffold,fednova --out=runs/fe_c10
  python benchmarks/fedentopt_compare.py --preset=paper --source=npz:mnist.npz \
      --set data.augment=none --rounds=200 --out=runs/fe_mnist_paper

Presets: ``digits`` (100 clients on the embedded digits, small CNN, 60
rounds), ``mnist_cpu`` (LeNet-5, 100 clients x 200 MNIST images, 60 rounds)
and ``paper`` (FedEntOpt's Table I setting: LeNet-5, 100 clients, all training
data, 500 rounds; use an accelerator). ``--rounds`` and ``--num_private``
shorten any preset. Selections: ``uniform`` (random), ``fedentopt``,
``fedentopt_dp`` (epsilon 0.5) and ``power_of_choice``.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import os
import time

import numpy as np

from fedjax_kd import config as config_lib
from fedjax_kd import presets, runner


def make(preset: str, setting: str, algorithm: str, selection: str, source: str | None):
  if preset == 'paper':
    return presets.fedentopt_paper(setting, source or 'tfds:cifar10', algorithm, selection)
  if preset == 'digits':
    return presets.fedentopt_cpu(setting, 'digits', algorithm, selection)
  if preset == 'mnist_cpu':
    return presets.fedentopt_cpu(setting, source or 'tfds:mnist', algorithm, selection)
  raise SystemExit(f'--preset={preset!r}: expected digits, mnist_cpu or paper')


def last_k(rows, key='test_acc', k=10) -> float:
  vals = [r[key] for r in rows if r.get(key) is not None]
  return float(np.mean(vals[-k:])) if vals else float('nan')


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--preset', default='digits')
  p.add_argument('--source', default=None)
  p.add_argument('--settings', default='c2,dir0.1')
  p.add_argument('--algorithms', default='fedavg')
  p.add_argument('--selections', default='uniform,fedentopt')
  p.add_argument('--seeds', type=int, default=1)
  p.add_argument('--rounds', type=int, default=0, help='0 = the preset\'s')
  p.add_argument('--num_private', type=int, default=0, help='0 = the preset\'s')
  p.add_argument('--set', action='append', default=[],
                 help='config override FIELD=VALUE (repeatable), e.g. data.augment=none')
  p.add_argument('--out', default='runs/fedentopt_compare')
  args = p.parse_args()
  overrides = {}
  for item in args.set:
    field, _, text = item.partition('=')
    try:
      overrides[field] = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      overrides[field] = text
  os.makedirs(args.out, exist_ok=True)
  settings = args.settings.split(',')
  algorithms = args.algorithms.split(',')
  selections = args.selections.split(',')
  per_round = []
  results = {}
  for setting in settings:
    for algorithm in algorithms:
      for selection in selections:
        for seed in range(args.seeds):
          c = make(args.preset, setting, algorithm, selection, args.source)
          c.seed = seed
          if args.rounds:
            c.rounds = args.rounds
          if args.num_private:
            c.data.num_private = args.num_private
          c.checkpoint.every = 0
          config_lib.override(c, overrides)
          name = f'{setting}_{algorithm}_{selection}_s{seed}'
          t0 = time.time()
          summary = runner.run(config_lib.validate(c), os.path.join(args.out, name),
                               resume=False, progress=False, log=lambda s: None)
          wall = time.time() - t0
          with open(os.path.join(args.out, name, 'metrics.jsonl')) as f:
            rows = [json.loads(line) for line in f]
          for r in rows:
            per_round.append({'setting': setting, 'algorithm': algorithm,
                              'selection': selection, 'seed': seed, 'round': r['round'],
                              'test_acc': r.get('test_acc'),
                              'label_coverage': r.get('label_coverage'),
                              'cohort_entropy': r.get('cohort_entropy')})
          results.setdefault((setting, algorithm, selection), []).append(
              {'last10': last_k(rows), 'best': summary['top_acc'],
               'coverage': last_k(rows, 'label_coverage', len(rows)),
               'entropy': last_k(rows, 'cohort_entropy', len(rows)),
               'wall': wall, 'rows': rows})
          print(f'{name}: last-10 acc {results[(setting, algorithm, selection)][-1]["last10"]:.4f}'
                f' ({wall:.0f}s)', flush=True)
  with open(os.path.join(args.out, 'per_round.csv'), 'w', newline='') as f:
    w = csv.DictWriter(f, fieldnames=list(per_round[0]))
    w.writeheader()
    w.writerows(per_round)
  num_classes = _num_classes(args.out)
  lines = ['| setting | algorithm | selection | last-10 acc | best acc | mean labels covered | '
           'rounds with all labels | mean entropy (bits) | wall s/run |',
           '|---|---|---|---|---|---|---|---|---|']
  for (setting, algorithm, selection), runs in results.items():
    last = np.array([r['last10'] for r in runs])
    std = f' ± {np.std(last, ddof=1):.4f}' if len(last) > 1 else ''
    full = np.mean([np.mean([r.get('label_coverage') == num_classes for r in run['rows']])
                    for run in runs])
    lines.append(f'| {setting} | {algorithm} | {selection} | {last.mean():.4f}{std} | '
                 f'{np.mean([r["best"] for r in runs]):.4f} | '
                 f'{np.mean([r["coverage"] for r in runs]):.2f} / {num_classes} | '
                 f'{100 * full:.0f} % | {np.mean([r["entropy"] for r in runs]):.3f} | '
                 f'{np.mean([r["wall"] for r in runs]):.0f} |')
  table = '\n'.join(lines)
  with open(os.path.join(args.out, 'summary.md'), 'w') as f:
    f.write(table + '\n')
  print(table)


def _num_classes(out: str) -> int:
  for name in sorted(os.listdir(out)):
    path = os.path.join(out, name, 'selection.json')
    if os.path.exists(path):
      with open(path) as f:
        return len(json.load(f)['label_counts'][0])
  return 0


if __name__ == '__main__':
  main()
