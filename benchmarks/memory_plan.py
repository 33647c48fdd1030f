r"""The device-memory estimate (:mod:`fedjax_kd.memory`) against measured peaks.

  python benchmarks/memory_plan.py [--sizes=small,medium,large] [--repeats=1] [--out=F.json]
  python benchmarks/memory_plan.py --from_json=docs/memory_plan_cpu.json   # the table again

Each size is a config run for one round in a fresh process (no checkpoint, no persistent
compilation cache). On a CPU the device is the host, so the measured peak is the process's
resident-set high-water mark (``VmHWM``) less its resident set just before the experiment is
built (JAX imported and started); it also holds what is not device memory (compiling, the
host copies made while loading data), so it is an upper bound of the device's peak. On a GPU
it is the device's own ``peak_bytes_in_use``, measured with XLA's autotuner off
(``--xla_gpu_autotune_level=0``; ``--autotune`` leaves it on): the autotuner tries
convolution algorithms with whatever workspace it can get, and backs off when the memory is
not there ("the caller indicates that this is not a failure"), so its trial workspaces raise
the peak of a run that has room without deciding whether a run fits. The error is
``estimate / measured - 1``.

The sizes (``small`` on the embedded digits; the others on MNIST, a Keras-layout
``mnist.npz`` at ``--mnist`` or ``$FEDJAX_KD_MNIST``):

* ``small``: the default config (DS-FL, 10 clients of cnn@0.5/cnn@1.0);
* ``medium``: DS-FL, 100 clients of dsfl_cnn, all trained at once, batch 50, each client
  model evaluated on the 10,000 test images (512 at a time);
* ``large``: DS-FL, 300 clients of dsfl_cnn, 60 a round, batch 60 (distillation 100),
  ``eval.chunk=64``, the server model evaluated (``eval.clients=false``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MNIST = ['--config.data.num_private=20000', '--config.data.num_public=2000',
          '--config.data.partition=shards', '--config.data.shards_per_client=2',
          '--config.clients.models=dsfl_cnn@1.0', '--config.server.model=dsfl_cnn@1.0',
          '--config.train.epochs=1', '--config.distill.epochs=1',
          '--config.distill.public_per_round=1000']
SIZES = {
    'small': [],
    'medium': _MNIST + ['--config.clients.num_clients=100', '--config.train.batch_size=50',
                        '--config.distill.batch_size=50'],
    'large': _MNIST + ['--config.clients.num_clients=300', '--config.clients.participation=0.2',
                       '--config.train.batch_size=60',
                       '--config.distill.batch_size=100', '--config.eval.chunk=64',
                       '--config.eval.clients=false'],
}


_CHILD = r'''
import json, sys
import jax, jax.numpy as jnp
from fedjax_kd import config as config_lib, experiment, memory, runner
from fedjax_kd import main as main_lib

def rss(field):
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024

jnp.zeros(1).block_until_ready()
fv = main_lib.parse(['x', '--config=default'] + json.loads(sys.argv[1]))
spec = config_lib.validate(fv.config)
dev = jax.local_devices()[0]
base = rss('VmRSS') if dev.platform == 'cpu' else dev.memory_stats()['bytes_in_use']
exp = experiment.build(spec)
plan = memory.plan(exp)
del exp
runner.run(spec, sys.argv[2], progress=False, memory_check=False)
if dev.platform == 'cpu':
  peak = rss('VmHWM') - base
else:
  peak = dev.memory_stats()['peak_bytes_in_use'] - base
print('RESULT ' + json.dumps({'data': plan.data, 'state': plan.state, 'step': plan.step,
                             'estimate': plan.total, 'measured': peak,
                             'platform': dev.platform, 'device_kind': dev.device_kind}))
'''


def size_args(size: str, mnist: str) -> list[str]:
  """The command-line overrides of ``size``."""
  return SIZES[size] + ([f'--config.data.source=npz:{mnist}'] if size != 'small' else [])


def measure(size: str, mnist: str, autotune: bool = False) -> dict:
  """One fresh process running ``size`` for a round: its estimate and measured peak."""
  args = size_args(size, mnist) + ['--config.rounds=1', '--config.checkpoint.every=0',
                        '--config.log.tensorboard=false']
  with tempfile.TemporaryDirectory() as work:
    env = dict(os.environ, FEDJAX_KD_COMPILATION_CACHE='',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')])))
    if not autotune:
      env['XLA_FLAGS'] = ' '.join(filter(None, [os.environ.get('XLA_FLAGS'),
                                                '--xla_gpu_autotune_level=0']))
    proc = subprocess.run([sys.executable, '-c', _CHILD, json.dumps(args),
                           os.path.join(work, 'run')], cwd=REPO, env=env, capture_output=True,
                          text=True, check=False)
  lines = [x for x in proc.stdout.splitlines() if x.startswith('RESULT ')]
  if proc.returncode or not lines:
    raise SystemExit(f'error: size {size} exited {proc.returncode}:\n{proc.stderr[-3000:]}')
  return json.loads(lines[-1][len('RESULT '):])


def table_row(r: dict) -> str:
  mib = 1 << 20
  return (f'| {r["size"]} | {r["data"] / mib:.1f} | {r["state"] / mib:.1f} | '
          f'{r["step"] / mib:.1f} | {r["estimate"] / mib:.1f} | {r["measured"] / mib:.1f} | '
          f'{r["error"]:+.0%} |')


HEADER = ('| size | data MiB | state MiB | largest step MiB | estimate MiB | measured peak MiB '
          '(median) | error |\n|---|---|---|---|---|---|---|')


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--sizes', default='small,medium,large')
  ap.add_argument('--repeats', type=int, default=1)
  ap.add_argument('--out', default=None)
  ap.add_argument('--from_json', default=None, help='print the table of a saved --out file')
  ap.add_argument('--autotune', action='store_true',
                  help="keep XLA's GPU autotuner on (its trial workspaces count in the peak)")
  ap.add_argument('--mnist', default=os.environ.get(
      'FEDJAX_KD_MNIST', os.path.join(REPO, '..', 'shared', 'data', 'mnist.npz')))
  a = ap.parse_args(argv)
  if a.from_json:
    with open(a.from_json) as f:
      rows = json.load(f)['rows']
    print(f'{rows[0]["device_kind"]} ({rows[0]["platform"]})')
    print(HEADER)
    print('\n'.join(table_row(r) for r in rows))
    return 0
  if a.sizes != 'small' and not os.path.exists(a.mnist):
    raise SystemExit(f'error: --mnist={a.mnist} does not exist: give a Keras-layout mnist.npz '
                     '(or --sizes=small)')
  rows = []
  print(HEADER)
  for size in a.sizes.split(','):
    runs = [measure(size, a.mnist, a.autotune) for _ in range(a.repeats)]
    r = dict(runs[0], size=size, measured=statistics.median(x['measured'] for x in runs),
             measured_runs=[x['measured'] for x in runs])
    r['error'] = r['estimate'] / r['measured'] - 1
    rows.append(r)
    print(table_row(r), flush=True)
  if a.out:
    from fedjax_kd import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
    workdir_lib.write_json(a.out, {'rows': rows}, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
