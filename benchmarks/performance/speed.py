r"""Rounds per minute on BlazeFL's published FedAvg workload and on DS-FL's MNIST round.

Workloads (built through the normal config -> ``experiment.build`` path):

* ``blazefl``: BlazeFL's quickstart-fedavg (kitsuyaazuma/BlazeFL): FedAvg on CIFAR-10,
  100 clients, all of them every round (sample_ratio 1.0), 200 shards (2 per client, 500
  images each), 5 local epochs of batch 50 (10 steps/epoch, 50 steps/round/client), SGD
  lr 0.1, the McMahan et al. 2017 / FedLab CIFAR CNN (``blazefl_cnn``, 878,538 params).
  BlazeFL reports about 3.7 rounds/min at best (1.4 at parallelism 1) on one A100.
* ``dsfl_mnist``: DS-FL's MNIST setting (configs/dsfl_mnist.py: K=100, 2 shards of
  20,000 private images, 20,000 public, dsfl_cnn, 5 + 5 epochs of batch 100, 1,000 public
  samples a round, ERA T=0.1, server distillation).

Data: real CIFAR-10 if tensorflow-datasets has it prepared locally, else a synthetic
CIFAR-shaped stand-in (uniform random uint8 32x32x3, 10 labels, 50,000 train / 10,000 test,
written to a temporary Keras-layout npz); real MNIST from ``--mnist`` (default
``$FEDJAX_KD_MNIST``) when present, else MNIST-shaped random data. Timing does not
depend on pixel values. The output says which data was used.

Timing: round 1 is run and timed separately (it includes compilation); then ``--rounds``
further rounds are timed, each blocked on its results. Evaluation is excluded (no
``evaluate`` call, and ``eval.every`` is set past the last round). ``--clients_per_round``
below 100 samples that many clients a round (participation = M / 100; clients still hold
500 CIFAR images each) and the full-round figures are extrapolated linearly in M (labelled
``extrapolated``).

  python benchmarks/performance/speed.py --workload=blazefl --rounds=1 --out=/tmp/speed.json
  python benchmarks/performance/speed.py --workload=all --clients_per_round=10 --rounds=3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
from fedjax_kd.algorithms import base
from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
from fedjax_kd.models import layers, registry  # pylint: disable=g-import-not-at-top
from fedjax_kd.running import experiment as experiment_lib  # pylint: disable=g-import-not-at-top

BLAZEFL_ROUNDS_PER_MIN = 3.7        # BlazeFL README, CNN, best parallelism, one A100
BLAZEFL_ROUNDS_PER_MIN_SERIAL = 1.4  # ... at parallelism 1
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_MNIST = os.environ.get('FEDJAX_KD_MNIST', '')


def _write_npz(path: str, shape: tuple[int, ...], n_train: int, n_test: int,
               seed: int = 0) -> str:
  """A Keras-layout npz of uniform random uint8 images with 10 balanced-ish labels."""
  rs = np.random.RandomState(seed)
  np.savez(path,
           x_train=rs.randint(0, 256, (n_train,) + shape, dtype=np.uint8),
           y_train=rs.randint(0, 10, n_train).astype(np.uint8),
           x_test=rs.randint(0, 256, (n_test,) + shape, dtype=np.uint8),
           y_test=rs.randint(0, 10, n_test).astype(np.uint8))
  return path


def cifar_source(tmp: str, n_train: int, n_test: int) -> tuple[str, str]:
  """(data.source, description): tfds:cifar10 if prepared locally, else synthetic npz."""
  if n_train == 50_000:
    try:
      from fedjax_kd.data import sources  # pylint: disable=g-import-not-at-top
      sources.load_source('tfds:cifar10')
      return 'tfds:cifar10', 'real CIFAR-10 (tfds)'
    except Exception:  # pylint: disable=broad-except  # DataError, or tfds not installed
      pass
  path = _write_npz(os.path.join(tmp, 'cifar_synthetic.npz'), (32, 32, 3), n_train, n_test)
  return f'npz:{path}', (f'synthetic CIFAR-shaped stand-in (random uint8 32x32x3, 10 labels, '
                         f'{n_train} train / {n_test} test)')


def mnist_source(tmp: str, path: str, n_train: int, n_test: int) -> tuple[str, str]:
  """(data.source, description): the real MNIST npz when present, else synthetic."""
  if path and os.path.isfile(path) and n_train >= 60_000:
    return f'npz:{os.path.abspath(path)}', f'real MNIST ({os.path.abspath(path)})'
  p = _write_npz(os.path.join(tmp, 'mnist_synthetic.npz'), (28, 28), n_train, n_test)
  return f'npz:{p}', (f'synthetic MNIST-shaped stand-in (random uint8 28x28, 10 labels, '
                      f'{n_train} train / {n_test} test)')


def blazefl_config(source: str, args) -> Any:
  """BlazeFL quickstart-fedavg: K=100, 200 shards, 5 x batch 50, SGD 0.1, its CNN."""
  c = config_lib.default_config()
  c.algorithm = 'fedavg'
  c.data.source = source
  c.data.num_public = 0
  c.data.num_private = -1
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.clients.num_clients = args.num_clients
  c.clients.models = ('blazefl_cnn',)
  c.clients.participation = args.clients_per_round / args.num_clients
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.1
  c.train.momentum = 0.0
  c.train.batch_size = 50
  c.train.epochs = 5
  return c


def dsfl_config(source: str, args) -> Any:
  """configs/dsfl_mnist.py (DS-FL's MNIST setting) on ``source``."""
  c = presets.dsfl_paper(source, 'dsfl_cnn')
  c.clients.num_clients = args.num_clients
  c.clients.participation = args.clients_per_round / args.num_clients
  if args.small:   # tiny sizes for tests
    c.data.num_public = 200
    c.data.num_private = 100 * args.num_clients
    c.distill.public_per_round = 100
  return c


def _finish(c, args) -> Any:
  c.rounds = args.rounds + 1
  c.train.compute_dtype = args.dtype
  c.eval.every = 10**9          # no evaluation inside the timed rounds
  c.eval.clients = False
  c.checkpoint.every = 0
  c.log.tensorboard = False
  return c


def steps_per_round(spec, exp, m: int) -> int:
  """Client minibatch steps of one round with ``m`` clients (local training + distillation)."""
  n = np.asarray(exp.ctx.data.client_n)
  b, e = spec.train.batch_size, spec.train.epochs
  per_client = float(np.mean(-(-n // b))) * e
  if spec.algorithm == 'dsfl':
    per_client += -(-spec.distill.public_per_round // spec.distill.batch_size) * spec.distill.epochs
  return int(round(per_client * m))


def time_workload(name: str, c, data_desc: str, args) -> dict[str, Any]:
  """Builds the experiment, runs round 1 (compile) and ``args.rounds`` timed rounds."""
  spec = config_lib.validate(_finish(c, args))
  t0 = time.perf_counter()
  # The conv models take their lowering at construction ('auto': im2col on CPU, XLA's
  # convolution on GPU/TPU); experiment.build has no field for it, so a forced lowering
  # wraps registry.get_model for the duration of the build.
  orig = registry.get_model
  if args.lowering != 'auto':
    registry.get_model = lambda *a, **k: orig(*a, **{**k, 'lowering': args.lowering})
  try:
    exp = experiment_lib.build(spec)
  finally:
    registry.get_model = orig
  algo = exp.algorithm
  state = algo.init()
  jax.block_until_ready(state)
  build_s = time.perf_counter() - t0
  selector = exp.ctx.selector

  def one_round(state, t):
    active = selector.plan(t, lambda mask, st=state: algo.selection_losses(st, mask)).active
    state, _ = base.play_round(algo, state, t, active)
    jax.block_until_ready(state)
    return state, int(active.sum())

  t0 = time.perf_counter()
  state, m = one_round(state, 1)
  first_s = time.perf_counter() - t0
  times = []
  for t in range(2, args.rounds + 2):
    t0 = time.perf_counter()
    state, m = one_round(state, t)
    times.append(time.perf_counter() - t0)
  round_s = float(np.mean(times))
  steps = steps_per_round(spec, exp, m)
  k = spec.clients.num_clients
  full_round_s = round_s * k / m
  row = {
      'workload': name, 'data': data_desc, 'algorithm': spec.algorithm,
      'model': spec.clients.models[0], 'num_clients': k, 'clients_per_round': m,
      'batch_size': spec.train.batch_size, 'epochs': spec.train.epochs,
      'compute_dtype': spec.train.compute_dtype,
      'lowering': layers.resolve_lowering(args.lowering),
      'build_s': build_s, 'first_round_s': first_s,
      'compile_s': max(0.0, first_s - round_s),
      'timed_rounds': len(times), 'round_times_s': times, 'round_s': round_s,
      'rounds_per_min': 60.0 / round_s, 'client_steps_per_round': steps,
      'client_steps_per_s': steps / round_s,
      'full_round_s': full_round_s, 'full_rounds_per_min': 60.0 / full_round_s,
      'full_round_extrapolated': m < k,
  }
  if name == 'blazefl':
    row['vs_blazefl_a100'] = row['full_rounds_per_min'] / BLAZEFL_ROUNDS_PER_MIN
    row['vs_blazefl_a100_serial'] = row['full_rounds_per_min'] / BLAZEFL_ROUNDS_PER_MIN_SERIAL
  return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--workload', default='all', choices=('blazefl', 'dsfl_mnist', 'all'))
  p.add_argument('--rounds', type=int, default=3, help='timed rounds after round 1')
  p.add_argument('--num_clients', type=int, default=100)
  p.add_argument('--clients_per_round', type=int, default=100)
  p.add_argument('--dtype', default='float32', choices=('float32', 'bfloat16'))
  p.add_argument('--lowering', default='auto', choices=layers.LOWERINGS)
  p.add_argument('--mnist', default=DEFAULT_MNIST, help='Keras-layout MNIST npz')
  p.add_argument('--small', action='store_true',
                 help='tiny synthetic data (tests): 500 images a client held constant')
  p.add_argument('--out', default='', help='write the results as JSON here')
  args = p.parse_args(argv)
  if not 1 <= args.clients_per_round <= args.num_clients:
    p.error('--clients_per_round must be in [1, --num_clients]')
  dev = jax.devices()[0]
  env = {'platform': dev.platform, 'device_kind': dev.device_kind,
         'num_devices': len(jax.devices()), 'jax_version': jax.__version__,
         'cpu_count': os.cpu_count()}
  print(f'jax {jax.__version__}, backend {dev.platform}, {len(jax.devices())} device(s): '
        f'{dev.device_kind}; evaluation excluded from timing')
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    if args.workload in ('blazefl', 'all'):
      n_train = 500 * args.num_clients if args.small else 50_000
      source, desc = cifar_source(tmp, n_train, 100 if args.small else 10_000)
      print(f'blazefl data: {desc}', flush=True)
      rows.append(time_workload('blazefl', blazefl_config(source, args), desc, args))
    if args.workload in ('dsfl_mnist', 'all'):
      n_train = 100 * args.num_clients + 200 if args.small else 60_000
      source, desc = mnist_source(tmp, '' if args.small else args.mnist, n_train,
                                  100 if args.small else 10_000)
      print(f'dsfl_mnist data: {desc}', flush=True)
      rows.append(time_workload('dsfl_mnist', dsfl_config(source, args), desc, args))
  print()
  print(f'{"workload":<11} {"dtype":<9} {"M":>4} {"compile s":>9} {"round s":>9} '
        f'{"rounds/min":>10} {"steps/s":>9} {"all-K rounds/min":>22} {"vs BlazeFL 3.7":>15}')
  for r in rows:
    full = f'{r["full_rounds_per_min"]:.3f}' + (f' (K={r["num_clients"]}, extrap.)'
                                                if r['full_round_extrapolated'] else '')
    vs = f'x{r["vs_blazefl_a100"]:.3f}' if 'vs_blazefl_a100' in r else '-'
    print(f'{r["workload"]:<11} {r["compute_dtype"]:<9} {r["clients_per_round"]:>4} '
          f'{r["compile_s"]:>9.1f} {r["round_s"]:>9.2f} {r["rounds_per_min"]:>10.3f} '
          f'{r["client_steps_per_s"]:>9.1f} {full:>22} {vs:>15}')
  result = {'env': env, 'args': vars(args), 'rows': rows,
            'blazefl_reference': {'rounds_per_min': BLAZEFL_ROUNDS_PER_MIN,
                                  'rounds_per_min_parallelism_1': BLAZEFL_ROUNDS_PER_MIN_SERIAL,
                                  'device': 'NVIDIA A100 (BlazeFL README)'}}
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=2)
    print(f'wrote {args.out}')
  return result


if __name__ == '__main__':
  main()
