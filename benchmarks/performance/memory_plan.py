r"""The device-memory plan (:mod:`fedjax_kd.running.memory`) against XLA's own figure and measured peaks.

  python benchmarks/performance/memory_plan.py [--sizes=small,medium,large] [--repeats=1] [--out=F.json]
  python benchmarks/performance/memory_plan.py --from_json=benchmarks/results/memory_plan_cpu.json   # the table again
  python benchmarks/performance/memory_plan.py --configs=all [--measure] [--out=F.json [--update]]   # shipped configs

``--configs`` (``all`` or names): each shipped config, built as the command line builds it
(data sets that cannot be read here replaced by stand-ins of their shapes, as in
``benchmarks/performance/config_costs.py``; real MNIST with ``--mnist``), in a fresh process: the
clients at once the planner chose (``clients.chunk='auto'``), its figure (less the CPU runtime
term), and XLA's own figure for the first round and its evaluation
(:func:`fedjax_kd.running.memory.xla_figure`: every kernel program compiled, not run, with
``compiled.memory_analysis()``). ``--measure`` also runs two rounds of it: the measured peak (as
below) and round 2's time; where all clients at once also fit the machine, it runs them so too, for
the time a round costs in chunks.

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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


# What both child processes start with: JAX started, and the process's resident set.
_PRELUDE = r'''
import json, sys, time
import jax, jax.numpy as jnp
from fedjax_kd import config as config_lib, runner
from fedjax_kd import main as main_lib
from fedjax_kd.running import experiment
from fedjax_kd.running import memory
from fedjax_kd.running import workdir

def rss(field):
  with open('/proc/self/status') as f:
    for line in f:
      if line.startswith(field + ':'):
        return int(line.split()[1]) * 1024

jnp.zeros(1).block_until_ready()
'''

_CHILD = _PRELUDE + r'''
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


_CONFIG_CHILD = _PRELUDE + r'''
args, work, measure = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3] == '1'
spec = config_lib.validate(main_lib.parse(['x'] + args).config)
dev = jax.local_devices()[0]
cpu = dev.platform == 'cpu'
base = rss('VmRSS') if cpu else dev.memory_stats()['bytes_in_use']
t0 = time.time()
exp = experiment.build(spec)
rough = exp.memory     # what the build chose with (on a CPU, the bound where it fits)
p = memory.plan(exp, client_chunk=exp.ctx.fed.client_chunk)   # XLA's figure per step
out = {'planned': p.total - p.runtime, 'runtime': p.runtime, 'phase': p.phase,
       'choice': p.choice(), 'chunk': p.chunk, 'slots': p.slots, 'plan_s': time.time() - t0,
       'bound': rough.total - rough.runtime if rough.bound else None,
       # all clients at once fit the machine itself (not a FEDJAX_KD_DEVICE_MEMORY cap)
       'all_fit': memory.plan(exp, client_chunk=None).total <= (memory._device_memory()[0] or 0)}
if not measure:
  t0 = time.time()
  x = memory.xla_figure(exp)
  out.update(xla=x.total, programs=x.programs, xla_s=time.time() - t0)
else:
  del exp
  runner.run(spec, work, progress=False, memory_check=False)
  rows = workdir.read_metrics(work)
  peak = rss('VmHWM') if cpu else dev.memory_stats()['peak_bytes_in_use']
  out.update(measured=peak - base, round_s=rows[-1]['round_time_s'], device=dev.device_kind)
print('RESULT ' + json.dumps(out))
'''


def _config_child(args: list[str], measure: bool) -> dict:
  with tempfile.TemporaryDirectory() as work:
    env = dict(os.environ, FEDJAX_KD_COMPILATION_CACHE='', XLA_PYTHON_CLIENT_PREALLOCATE='false',
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get('PYTHONPATH')])))
    env['XLA_FLAGS'] = ' '.join(filter(None, [os.environ.get('XLA_FLAGS'),
                                              '--xla_gpu_autotune_level=0']))
    proc = subprocess.run([sys.executable, '-c', _CONFIG_CHILD, json.dumps(args),
                           os.path.join(work, 'run'), '1' if measure else '0'], cwd=REPO,
                          env=env, capture_output=True, text=True, check=False)
  lines = [x for x in proc.stdout.splitlines() if x.startswith('RESULT ')]
  if proc.returncode or not lines:
    err = [x for x in proc.stderr.splitlines() if x.strip()]
    return {'error': (err[-1] if err else f'exit {proc.returncode}')[:300]}
  return json.loads(lines[-1][len('RESULT '):])


def measure_config(name: str, folder: str, mnist: str, measure: bool) -> dict:
  """One shipped config: the plan and XLA's figure; with ``measure``, two rounds run."""
  sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
  import config_costs  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  c = config_lib.load_file(name)
  overrides, labels = config_costs.stand_in_overrides(c, folder, mnist)
  args = [f'--config={name}', *overrides]
  row = dict(config=name, data=', '.join(labels), **_config_child(args, False))
  if 'xla' in row:
    row['error_pct'] = 100 * (row['planned'] / row['xla'] - 1)
  if measure and 'error' not in row:
    run = ['--config.rounds=2', '--config.checkpoint.every=0', '--config.log.tensorboard=false']
    row.update(_config_child(args + run, True))
    if row.get('chunk') is not None and row.get('all_fit'):   # all at once, where they fit
      whole = _config_child(args + run + [f'--config.clients.chunk={row["slots"]}'], True)
      if 'round_s' in whole:
        row['unchunked_round_s'] = whole['round_s']
  return row


def config_header(measured: bool) -> str:
  cols = ['config', 'clients at once', 'planned', "XLA's figure", 'planned / XLA']
  cols += ['measured peak', 'a round', 'all at once'] if measured else []
  return '| ' + ' | '.join(cols) + ' |\n|' + '---|' * len(cols)


def config_row(r: dict, measured: bool) -> str:
  from fedjax_kd.running.memory import fmt  # pylint: disable=g-import-not-at-top
  if 'error' in r and 'planned' not in r:
    return f'| `{r["config"]}` | {r["error"]} |' + ' |' * (6 if measured else 3)
  row = (f'| `{r["config"]}` | {r["choice"]} | {fmt(r["planned"])} | {fmt(r["xla"])} | '
         f'{r["error_pct"]:+.0f} % |')
  if measured:
    sec = lambda k: f' {r[k]:.0f} s |' if r.get(k) is not None else ' – |'
    row += (f' {fmt(r["measured"]) if r.get("measured") else "–"} |' + sec('round_s')
            + sec('unchunked_round_s'))
  return row


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--sizes', default='small,medium,large')
  ap.add_argument('--repeats', type=int, default=1)
  ap.add_argument('--out', default=None)
  ap.add_argument('--from_json', default=None, help='print the table of a saved --out file')
  ap.add_argument('--autotune', action='store_true',
                  help="keep XLA's GPU autotuner on (its trial workspaces count in the peak)")
  ap.add_argument('--configs', default='',
                  help="shipped configs, comma-separated, or 'all': plan against XLA's figure")
  ap.add_argument('--measure', action='store_true',
                  help='--configs: also run two rounds (measured peak, time per round)')
  ap.add_argument('--update', action='store_true',
                  help="--configs: replace these configs' rows of the --out file, keep the rest")
  ap.add_argument('--mnist', default=os.environ.get(
      'FEDJAX_KD_MNIST', os.path.join(REPO, '..', 'shared', 'data', 'mnist.npz')))
  a = ap.parse_args(argv)
  if a.configs:
    sys.path.insert(0, REPO)
    from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
    names = [n for n in config_lib.shipped_configs()
             if a.configs == 'all' or n in a.configs.split(',')]
    names = [n for n in names if not n.startswith('leaf_')]   # their clients are LEAF's files
    rows = []
    commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, text=True,
                            capture_output=True, check=False).stdout.strip()
    dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=REPO,
                           text=True, capture_output=True, check=False).stdout.strip()
    print(config_header(a.measure))
    with tempfile.TemporaryDirectory(prefix='fedjax_kd_memory_') as folder:
      for name in names:
        rows.append(dict(measure_config(name, folder,
                                        a.mnist if os.path.exists(a.mnist) else '', a.measure),
                         commit=commit + ('+' if dirty else '')))
        print(config_row(rows[-1], a.measure), flush=True)
    if a.out:
      from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
      doc = {'configs': rows}
      if a.update and os.path.exists(a.out):
        with open(a.out) as f:
          doc = json.load(f)
        sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
        import config_costs  # pylint: disable=g-import-not-at-top
        doc['configs'] = sorted(config_costs.merge_rows(doc['configs'], rows),
                                key=lambda r: r['config'])
      workdir_lib.write_json(a.out, doc, indent=2)
    return 0
  if a.from_json:
    with open(a.from_json) as f:
      doc = json.load(f)
    if 'configs' in doc:
      measured = any('measured' in r for r in doc['configs'])
      print(config_header(measured))
      print('\n'.join(config_row(r, measured) for r in doc['configs']))
      return 0
    rows = doc['rows']
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
    from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
    workdir_lib.write_json(a.out, {'rows': rows}, indent=2)
  return 0


if __name__ == '__main__':
  sys.exit(main())
