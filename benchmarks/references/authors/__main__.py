r"""Runs the baselines beside their authors' code and writes the table the report prints.

  bash benchmarks/references/authors/fetch.sh DIR          # once: the authors' repositories
  python -m benchmarks.references.authors --authors=DIR [--only=fedrs,fedala] [--seed=0] \
      [--out=benchmarks/results/authors_lockstep.json]

Each driver (``benchmarks/references/authors/<baseline>.py``) runs fedjax_kd's rounds and the
authors' code on the same weights, data order and minibatches and compares every parameter after
every round. A baseline whose checkout is missing (or PyTorch) is listed with the reason; with
``--only`` the other entries of ``--out`` are kept as they were.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

from benchmarks.references.authors import common
from fedjax_kd.running import workdir as workdir_lib

OUT = os.path.join(common.REPO, 'benchmarks', 'results', 'authors_lockstep.json')


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog='python -m benchmarks.references.authors', description=__doc__.split(
      '\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--authors', default=common.authors_dir(),
                 help=f'the folder of checkouts (fetch.sh DIR; default ${common.AUTHORS_ENV})')
  p.add_argument('--only', default='', help='comma-separated baselines (default: all)')
  p.add_argument('--seed', type=int, default=0)
  p.add_argument('--out', default=OUT)
  a = p.parse_args(argv)
  names = [n for n in a.only.split(',') if n] or list(common.REPOS)
  unknown = sorted(set(names) - set(common.REPOS))
  if unknown:
    print(f'error: --only: {unknown} have no lock-step; choose from {sorted(common.REPOS)}',
          file=sys.stderr)
    return 2
  if not a.authors:
    print(f'error: --authors: no folder of checkouts (bash benchmarks/references/authors/fetch.sh '
          f'DIR, then --authors=DIR or ${common.AUTHORS_ENV}=DIR)', file=sys.stderr)
    return 2
  old = {}
  if a.only and os.path.exists(a.out):
    with open(a.out, encoding='utf-8') as f:
      old = {r['baseline']: r for r in json.load(f)['lockstep']}
  results, skipped = common.run_all(names, a.authors, seed=a.seed)
  for r in results:
    print(f'{r.baseline}: {r.rounds} rounds, largest parameter difference '
          f'{max(r.param_diff):.1e}, accuracy difference {r.acc_diff:.4f}: '
          f'{"holds" if r.holds else "DOES NOT HOLD"}')
  for name, why in skipped.items():
    print(f'{name}: not run ({why})')
  rows = {**old, **{r.baseline: dict(r.to_json(), seed=a.seed) for r in results}}
  doc = {'generated': datetime.date.today().isoformat(), 'command': ' '.join(
      ['python -m benchmarks.references.authors'] + [x for x in (argv or sys.argv[1:])
                                          if not x.startswith('--authors')]),
         'tolerance': common.PARAM_TOL,
         'lockstep': [rows[n] for n in common.REPOS if n in rows],
         'not_lockstepped': common.NOT_LOCKSTEPPED}
  workdir_lib.write_text(a.out, json.dumps(doc, indent=1) + '\n')
  print(f'wrote {a.out}')
  return 0 if all(r.holds for r in results) else 1


if __name__ == '__main__':
  sys.exit(main())
