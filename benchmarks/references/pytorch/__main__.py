r"""Runs a PyTorch reference on fedjax_kd's exact data, partition and open-set draws.

  python -m benchmarks.references.pytorch --algorithm=dsfl --mnist=/path/to/mnist.npz \
      --seeds=0,1,2 --variants=era,sa --out=runs/torch_dsfl [--rounds=15] [--threads=2] \
      [--set reference.init=fedjax --set reference.batches=fedjax ...]

``--set`` takes fedjax_kd config fields (``clients.num_clients=4``; several values make a
grid, as in ``python -m fedjax_kd.sweep``) and the reference's switches
(``reference.bn_running_var``, ``reference.init``, ``reference.batches``, ``reference.seed_offset``;
see ``benchmarks/references/pytorch/common.py``). The output directory is laid out as a
``fedjax_kd.sweep`` directory; a finished run is skipped when the command is rerun.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from typing import Sequence

from benchmarks.references.pytorch import common
from fedjax_kd import sweep
from fedjax_kd.errors import ConfigError

ALGORITHMS = ('dsfl', 'fedentopt', 'scarlet', 'acepfl', 'fedcache2')


def load(algorithm: str):
  """The reference module of ``algorithm``."""
  if algorithm not in ALGORITHMS:
    raise ConfigError('--algorithm', algorithm, ALGORITHMS)
  return importlib.import_module(f'benchmarks.references.pytorch.{algorithm}')


def variants(module, keys: Sequence[str], switches: dict) -> list[sweep.Variant]:
  """The module's variants ``keys``, each with the reference switches (named in the label)."""
  out = []
  suffix = ', '.join(f'{k.split(".", 1)[1]}={v}' for k, v in switches.items())
  for key in keys:
    if key not in module.VARIANTS:
      raise ConfigError('--variants', key, tuple(module.VARIANTS))
    label, algorithm, fields = module.VARIANTS[key]
    out.append(sweep.Variant(label + (f' ({suffix})' if suffix else ''), algorithm,
                             {**fields, **switches}))
  return out


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--algorithm', default='dsfl', help=f'one of {", ".join(ALGORITHMS)}')
  p.add_argument('--mnist', default=common.MNIST_DEFAULT,
                 help='MNIST .npz (Keras layout; default $FEDJAX_KD_MNIST)')
  p.add_argument('--config', default=None, help="a fedjax_kd config file (default: the "
                 "algorithm's CPU config)")
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--variants', default=None, help="the algorithm's variants (default: all)")
  p.add_argument('--rounds', type=int, default=None, help="default: the config's")
  p.add_argument('--threads', type=int, default=0, help='torch threads (0: its default)')
  p.add_argument('--out', required=True)
  p.add_argument('--set', action='append', default=[], metavar='FIELD=VALUE',
                 help='a fedjax_kd config field or a reference.* switch')
  a = p.parse_args(argv)
  try:
    module = load(a.algorithm)
    if not a.mnist:
      raise ConfigError('--mnist', '', 'a Keras-layout mnist.npz (or set $FEDJAX_KD_MNIST)')
    if not os.path.exists(a.mnist):
      raise ConfigError('--mnist', a.mnist, 'an existing file')
    fixed, grid = sweep.parse_set(a.set)
    if any(f.startswith('reference.') for f in grid):
      raise ConfigError('--set', a.set, 'one value per reference.* switch')
    _, fields = common.split_reference(fixed)
    keys = a.variants.split(',') if a.variants else list(module.DEFAULT_VARIANTS)
    vs = variants(module, keys, {k: v for k, v in fixed.items() if k.startswith('reference.')})
    if importlib.util.find_spec('torch') is None:
      raise ConfigError('torch', 'not installed', "pip install -e '.[bench]' (a benchmark "
                        'extra, never a dependency)')
    overrides = [('data.source', f'npz:{os.path.abspath(a.mnist)}'), *module.FIXED, *fields]
    if a.rounds is not None:
      overrides.append(('rounds', a.rounds))
    from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
    config = a.config or module.CONFIG
    base = config_lib.load_file(config if os.path.isabs(config)
                                else os.path.join(common.REPO, config))
    runs = common.plan(base, vs, [int(s) for s in a.seeds.split(',')], a.out, overrides,
                       grid)
  except ConfigError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  sweep.write_plan(a.out, runs, config=config, engine='torch', algorithm=a.algorithm,
                   metrics=list(module.METRICS), overrides=dict(overrides),
                   thresholds=list(runs[0].config.comm.thresholds))
  common.execute(module, runs, a.threads)
  cells = sweep.aggregate(a.out)
  sweep.write_outputs(a.out, cells, thresholds=tuple(runs[0].config.comm.thresholds))
  return 0


if __name__ == '__main__':
  sys.exit(main())
