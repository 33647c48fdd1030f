r"""Peak memory and round time against the number of clients K (1% participation).

Each K runs the command-line entry point (``python -m fedjax_kd.main``) in its
own process under ``/usr/bin/time -v``, on MNIST-shaped uint8 data (28x28x1)
where every client holds ``--per_client`` images, so the work per participant
is the same for every K and only the population (and, at a fixed
participation, the participants) grows:

  * ``--store=host``: client states in host memory; a round gathers only its
    participants to the device and writes them back (`fedjax_kd.core.store`);
  * ``--store=disk``: the same with the client arrays in ``.npy`` memory maps;
  * ``--store=device``: every client's state stacked on the device (the
    engine's default), for comparison.

Per K it reports the peak resident memory of the process (``/usr/bin/time``'s
"Maximum resident set size"; on a CPU backend device arrays live there too),
the time of round 1 (it compiles) and the mean ``round_time_s`` of rounds
2..R from the run's ``metrics.jsonl``, the setup time (loading, partitioning,
initialising the K client models: wall time minus the rounds) and the server
model's accuracy after the last round. ``--markdown`` prints the table for
``docs/performance.md``.

  python benchmarks/performance/scale_clients.py --clients=1000,10000,100000
  python benchmarks/performance/scale_clients.py --clients=1000,10000,100000 --algorithm=dsfl
  python benchmarks/performance/scale_clients.py --clients=1000,10000 --store=device
  python benchmarks/performance/scale_clients.py --clients=1000,10000,100000 --per_round=100

The experiment is this file's ``get_config`` (a config file of the CLI:
``--config=benchmarks/performance/scale_clients.py:<K>``); the command of each K is
printed, so one row can be rerun by hand. The images are synthetic (class
prototypes plus noise, uint8, as MNIST's), written once per size to
``--data_dir``: MNIST has 60,000 training images, fewer than one per client at
K = 100,000, and timing does not depend on pixel values.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PER_CLIENT = 10     # images per client (and the local batch: one step per epoch)
PUBLIC = 2000       # open-set images carved from the training split
TEST = 2000         # test images


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
  tmp = path + '.tmp.npz'
  np.savez(tmp, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
  os.replace(tmp, path)


def get_config(arg: str = '100000'):
  """The experiment at K = ``arg`` clients (a config file of ``fedjax_kd.main``).

  FedAvg with the host store, 1% participation, ``cnn@0.25`` (13k parameters,
  51 KB of client state), IID, ``PER_CLIENT`` images per client and one local
  step a round; the server model is scored once, after the last round; client
  models are never scored (K evaluations are an evaluation pass, not a round)
  and nothing is checkpointed. ``data.source`` names a file the benchmark
  writes (override it to run by hand).
  """
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  k = int(arg)
  c = config_lib.default_config()
  c.algorithm = 'fedavg'
  c.seed = 0
  c.rounds = 3
  c.data.source = f'npz:{npz_path(default_data_dir(), k * PER_CLIENT + PUBLIC)}'
  c.data.num_public = PUBLIC
  c.data.num_private = -1
  c.data.partition = 'iid'
  c.clients.num_clients = k
  c.clients.models = ('cnn@0.25',)
  c.clients.participation = 0.01
  c.clients.store = 'host'
  c.train.batch_size = PER_CLIENT
  c.train.epochs = 1
  c.distill.public_per_round = 100
  c.distill.batch_size = 50
  c.distill.epochs = 1
  c.eval.every = c.rounds
  c.eval.clients = False
  c.checkpoint.every = 0
  c.log.tensorboard = False
  return c


def default_data_dir() -> str:
  return os.path.join(tempfile.gettempdir(), 'fedjax_kd_scale')


def npz_path(data_dir: str, n_train: int) -> str:
  return os.path.join(data_dir, f'mnist_like_{n_train}.npz')


def command(args, k: int, npz: str, workdir: str) -> list[str]:
  """The CLI command of one K (without ``/usr/bin/time``)."""
  participation = min(1.0, args.per_round / k) if args.per_round else args.participation
  overrides = {
      'data.source': f'npz:{npz}', 'algorithm': args.algorithm, 'rounds': args.rounds,
      'clients.models': f"('{args.model}',)", 'clients.participation': participation,
      'clients.store': args.store, 'train.batch_size': args.per_client,
      'distill.public_per_round': args.public_per_round, 'eval.every': args.rounds,
  }
  return ([sys.executable, '-m', 'fedjax_kd.main',
           f'--config={os.path.relpath(os.path.abspath(__file__), REPO)}:{k}',
           f'--workdir={workdir}', '--noresume', '--noprogress']
          + [f'--config.{name}={value}' for name, value in overrides.items()])


def _time_v(stderr: str) -> tuple[float | None, float | None]:
  """Peak RSS (GB) and elapsed wall seconds from ``/usr/bin/time -v``'s report."""
  rss = re.search(r'Maximum resident set size \(kbytes\): (\d+)', stderr)
  wall = re.search(r'Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)', stderr)
  seconds = None
  if wall:
    seconds = 0.0
    for part in wall.group(1).split(':'):
      seconds = seconds * 60 + float(part)
  return (int(rss.group(1)) / 2**20 if rss else None), seconds


def one(args, k: int, workroot: str) -> dict:
  """Runs K clients in a fresh process and reads its measurements."""
  n_train = k * args.per_client + PUBLIC
  npz = npz_path(args.data_dir, n_train)
  if not os.path.exists(npz):
    os.makedirs(args.data_dir, exist_ok=True)
    make_npz(npz, n_train, TEST)
  workdir = os.path.join(workroot, f'k{k}')
  cmd = command(args, k, npz, workdir)
  timed = os.path.exists('/usr/bin/time')
  print('$ ' + ('/usr/bin/time -v ' if timed else '') + ' '.join(cmd), flush=True)
  proc = subprocess.run((['/usr/bin/time', '-v'] if timed else []) + cmd, cwd=REPO,
                        capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-25:]
    return {'clients': k, 'store': args.store, 'error': tail, 'exit': proc.returncode}
  rss, wall = _time_v(proc.stderr)
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  times = [r['round_time_s'] for r in rows]
  out = {
      'clients': k, 'store': args.store, 'algorithm': args.algorithm, 'model': args.model,
      'per_round': rows[0]['participants'], 'images_per_client': args.per_client,
      'first_round_s': times[0],
      'round_s': float(np.mean(times[1:])) if len(times) > 1 else times[0],
      'round_times_s': times, 'peak_rss_gb': rss, 'wall_s': wall,
      'setup_s': None if wall is None else wall - sum(times),
      'test_acc': rows[-1].get('test_acc'), 'command': ' '.join(cmd),
  }
  if not args.keep:
    shutil.rmtree(workdir, ignore_errors=True)
  return out


def markdown(rows: list[dict]) -> str:
  """The table of ``docs/performance.md``: the later rounds one by one (the last one also
  scores the server model on the test set)."""
  lines = ['| K | participants / round | peak RSS | setup | round 1 (compiles) | later rounds |',
           '|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    if 'error' in r:
      lines.append(f'| {r["clients"]:,} | failed (exit {r["exit"]}) | | | | |')
      continue
    later = ', '.join(f'{t:.2f} s' for t in r['round_times_s'][1:])
    setup = '-' if r['setup_s'] is None else f'{r["setup_s"]:.0f} s'
    rss = '-' if r['peak_rss_gb'] is None else f'{r["peak_rss_gb"]:.2f} GB'
    lines.append(f'| {r["clients"]:,} | {r["per_round"]:,} | {rss} | {setup} | '
                 f'{r["first_round_s"]:.1f} s | {later} |')
  return '\n'.join(lines)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--clients', default='1000,10000,100000')
  p.add_argument('--store', default='host', choices=('device', 'host', 'disk'))
  p.add_argument('--algorithm', default='fedavg')
  p.add_argument('--model', default='cnn@0.25')
  p.add_argument('--participation', type=float, default=0.01)
  p.add_argument('--per_round', type=int, default=0,
                 help='clients per round for every K (overrides --participation)')
  p.add_argument('--per_client', type=int, default=PER_CLIENT)
  p.add_argument('--public_per_round', type=int, default=100)
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--data_dir', default=default_data_dir(),
                 help='where the synthetic npz files are written (and reused)')
  p.add_argument('--keep', action='store_true', help='keep the runs\' workdirs')
  p.add_argument('--markdown', action='store_true', help='print a markdown table at the end')
  p.add_argument('--out', default='', help='write the measurements as JSON')
  args = p.parse_args()
  workroot = tempfile.mkdtemp(prefix='scale_clients_')
  rows = []
  print(f'{"K":>8} {"store":>6} {"per round":>9} {"setup s":>8} {"round 1 s":>9} '
        f'{"round s":>8} {"peak RSS GB":>11} {"test acc":>8}', flush=True)
  for k in (int(x) for x in args.clients.split(',')):
    r = one(args, k, workroot)
    rows.append(r)
    if 'error' in r:
      print(f'{k:>8} {args.store:>6} failed (exit {r["exit"]}):\n  ' + '\n  '.join(r['error']),
            flush=True)
      continue
    setup = float('nan') if r['setup_s'] is None else r['setup_s']
    rss = float('nan') if r['peak_rss_gb'] is None else r['peak_rss_gb']
    print(f'{k:>8} {r["store"]:>6} {r["per_round"]:>9} {setup:>8.1f} '
          f'{r["first_round_s"]:>9.2f} {r["round_s"]:>8.3f} {rss:>11.2f} '
          f'{r["test_acc"]:>8.4f}', flush=True)
  if args.markdown:
    print(markdown(rows))
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(rows, f, indent=2)
  if not args.keep:
    shutil.rmtree(workroot, ignore_errors=True)


if __name__ == '__main__':
  main()
