r"""Peak memory and round time against the number of clients K (1% participation).

Each K runs in its own process (peak resident memory only grows), on
MNIST-shaped data (28x28x1) where every client holds ``--per_client`` images,
so the work of a round is the same for every K and only the population grows:

  * ``--store=host``: client states in host memory; a round gathers only its
    participants to the device and writes them back (`fedjax_kd.core.store`);
  * ``--store=disk``: the same with the client arrays in ``.npy`` memory maps;
  * ``--store=device``: every client's state stacked on the device (the
    engine's default), for comparison.

Per K it prints and writes (``--out``) the build and init times, the mean time
of rounds 2..R (round 1 compiles), the peak resident memory of the process
(``ru_maxrss``; on a CPU backend device arrays live there too), the bytes of
client state, and the server model's accuracy after the last round.

  python benchmarks/scale_clients.py --clients=1000,10000,100000 --store=host
  python benchmarks/scale_clients.py --clients=1000,10000 --store=device
  python benchmarks/scale_clients.py --clients=1000,10000,100000 --per_round=100
  python benchmarks/scale_clients.py --clients=10000 --algorithm=scarlet

The images are synthetic (class prototypes plus noise, uint8), written once
to an ``.npz`` in a temporary folder: MNIST has 60,000 training images, fewer
than 10 per client at K = 100,000, and timing does not depend on pixel values.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np


def make_npz(path: str, n_train: int, n_test: int, seed: int = 0) -> None:
  """MNIST-shaped uint8 images: 10 class prototypes plus Gaussian noise."""
  rng = np.random.default_rng(seed)
  protos = rng.uniform(0, 255, size=(10, 28, 28))

  def draw(n):
    y = (np.arange(n) % 10).astype(np.int64)
    rng.shuffle(y)
    x = np.empty((n, 28, 28), np.uint8)
    for lo in range(0, n, 100_000):   # bounded temporaries
      hi = min(n, lo + 100_000)
      noise = rng.normal(0, 40, size=(hi - lo, 28, 28))
      x[lo:hi] = np.clip(protos[y[lo:hi]] + noise, 0, 255).astype(np.uint8)
    return x, y

  x_train, y_train = draw(n_train)
  x_test, y_test = draw(n_test)
  np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)


def config_for(args, k: int, npz: str, workdir: str):
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.default_config()
  c.algorithm = args.algorithm
  c.seed = 0
  c.rounds = args.rounds
  c.data.source = f'npz:{npz}'
  c.data.num_public = args.public
  c.data.num_private = -1
  c.data.partition = 'iid'
  c.clients.num_clients = k
  c.clients.models = (args.model,)
  # --per_round fixes the participants (the same work for every K), else a fraction.
  c.clients.participation = (min(1.0, args.per_round / k) if args.per_round
                             else args.participation)
  c.clients.store = args.store
  c.clients.store_dir = os.path.join(workdir, 'client_store') if args.store == 'disk' else ''
  c.train.batch_size = args.per_client
  c.train.epochs = 1
  c.distill.public_per_round = args.public_per_round
  c.distill.batch_size = 100
  c.distill.epochs = 1
  c.eval.every = args.rounds
  c.eval.clients = False       # scoring all K client models is an evaluation pass, not a round
  c.checkpoint.every = 0
  c.log.tensorboard = False
  return config_lib.validate(c)


def one(args) -> dict:
  """Runs one K in this process and returns its measurements."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd import experiment  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  k = args.one
  tmp = tempfile.mkdtemp(prefix='scale_')
  npz = os.path.join(tmp, 'data.npz')
  make_npz(npz, k * args.per_client + args.public, 2000)
  spec = config_for(args, k, npz, tmp)
  t0 = time.perf_counter()
  exp = experiment.build(spec, tmp)
  algo = exp.algorithm
  t_build = time.perf_counter() - t0
  t0 = time.perf_counter()
  state = base.init_state(algo)
  jax.block_until_ready(jax.tree.leaves(state))
  t_init = time.perf_counter() - t0
  state_bytes = sum(np.asarray(x).nbytes if isinstance(x, np.ndarray) else x.nbytes
                    for x in jax.tree.leaves(state.clients))
  times = []
  selector = exp.ctx.selector
  for t in range(1, spec.rounds + 1):
    t0 = time.perf_counter()
    plan = selector.plan(t, None)
    state, out = base.play_round(algo, state, t, plan.active)
    jax.block_until_ready(jax.tree.leaves(state.server))
    times.append(time.perf_counter() - t0)
  metrics = algo.evaluate(state)
  return {
      'clients': k, 'store': spec.store, 'algorithm': spec.algorithm, 'model': args.model,
      'per_round': int(round(k * spec.participation)), 'images_per_client': args.per_client,
      'build_s': t_build, 'init_s': t_init, 'first_round_s': times[0],
      'round_s': float(np.mean(times[1:])) if len(times) > 1 else times[0],
      'peak_rss_gb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
      'client_state_gb': state_bytes / 2**30, 'test_acc': metrics.get('test_acc'),
      'device': jax.devices()[0].device_kind, 'platform': jax.devices()[0].platform,
      'jax': jax.__version__,
  }


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--clients', default='1000,10000,100000')
  p.add_argument('--store', default='host', choices=('device', 'host', 'disk'))
  p.add_argument('--algorithm', default='dsfl')
  p.add_argument('--model', default='cnn@0.25')
  p.add_argument('--participation', type=float, default=0.01)
  p.add_argument('--per_round', type=int, default=0,
                 help='clients per round for every K (overrides --participation)')
  p.add_argument('--per_client', type=int, default=10)
  p.add_argument('--public', type=int, default=2000)
  p.add_argument('--public_per_round', type=int, default=1000)
  p.add_argument('--rounds', type=int, default=4)
  p.add_argument('--out', default='')
  p.add_argument('--one', type=int, default=0, help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.one:
    print(json.dumps(one(args)))
    return
  rows = []
  print(f'{"K":>8} {"store":>6} {"per round":>9} {"build s":>8} {"init s":>7} '
        f'{"round 1 s":>9} {"round s":>8} {"peak RSS GB":>11} {"state GB":>8}', flush=True)
  for k in (int(x) for x in args.clients.split(',')):
    cmd = [sys.executable, __file__, f'--one={k}'] + [a for a in sys.argv[1:]
                                                    if not a.startswith('--clients')]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
      tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
      print(f'{k:>8} {args.store:>6} failed (exit {proc.returncode}): {" | ".join(tail)}',
            flush=True)
      rows.append({'clients': k, 'store': args.store, 'error': tail,
                   'exit': proc.returncode})
      continue
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    rows.append(r)
    print(f'{k:>8} {r["store"]:>6} {r["per_round"]:>9} {r["build_s"]:>8.1f} '
          f'{r["init_s"]:>7.1f} {r["first_round_s"]:>9.2f} {r["round_s"]:>8.3f} '
          f'{r["peak_rss_gb"]:>11.2f} {r["client_state_gb"]:>8.3f}', flush=True)
  if rows and 'device' in rows[0]:
    print(f'device: {rows[0]["device"]} ({rows[0]["platform"]}), jax {rows[0]["jax"]}')
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(rows, f, indent=2)


if __name__ == '__main__':
  main()
