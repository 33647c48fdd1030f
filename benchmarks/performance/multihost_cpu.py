r"""Round time of a multi-process run on one machine against one process, side by side.

  python benchmarks/performance/multihost_cpu.py --processes=2 --repeats=3 [--config=configs/default.py] \
      [--rounds=6] [--out=runs/multihost_cpu.json]

Per repeat, three runs of the same command (``python -m fedjax_kd.main``), one after the other:

* ``1 process x 1 device``: the plain run;
* ``1 process x N devices``: ``XLA_FLAGS=--xla_force_host_platform_device_count=N``, the
  client axis sharded over N CPU devices in one process;
* ``N processes x 1 device``: N processes on localhost joined by ``jax.distributed``
  (coordinator on a free port, gloo collectives over loopback), the same N-device mesh.

Each run's steady round time is the mean ``round_time_s`` of its rounds 3..R from
``metrics.jsonl`` (rounds 1 and 2 compile their kernels); the table gives, per layout, the median
over repeats, and the ratio to one process with N devices. On a CPU this measures the cost of
the multi-controller runtime (cross-process transfers through gloo), not a speed-up: every
process shares the same cores. All runs share one compilation cache in the output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _steady(workdir: str) -> float:
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [json.loads(line) for line in f]
  times = [r['round_time_s'] for r in rows if r['round'] >= 3]
  if not times:
    raise SystemExit(f'error: {workdir}: fewer than 3 rounds (use --rounds >= 3)')
  return statistics.fmean(times)


def run_layout(config: str, rounds: int, processes: int, devices: int, workdir: str,
               cache: str) -> float:
  """Runs one layout to completion; returns its steady round time in seconds."""
  env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS='cpu', FEDJAX_KD_COMPILATION_CACHE=cache,
             XLA_FLAGS=f'--xla_force_host_platform_device_count={devices}')
  cmd = [sys.executable, '-m', 'fedjax_kd.main', f'--config={config}',
         f'--config.rounds={rounds}', f'--workdir={workdir}', '--noprogress']
  if processes > 1:
    port = _free_port()
    cmds = [cmd + [f'--coordinator_address=127.0.0.1:{port}', f'--num_processes={processes}',
                   f'--process_id={i}'] for i in range(processes)]
  else:
    cmds = [cmd]
  procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for c in cmds]
  outs = [p.communicate()[0] for p in procs]
  for p, out in zip(procs, outs):
    if p.returncode:
      raise SystemExit(f'error: {" ".join(p.args)} exited {p.returncode}:\n{out[-2000:]}')
  return _steady(workdir)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--config', default=os.path.join(REPO, 'configs', 'default.py'))
  p.add_argument('--processes', type=int, default=2)
  p.add_argument('--rounds', type=int, default=6)
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--out', default='')
  a = p.parse_args(argv)
  if a.processes < 2 or a.rounds < 3 or a.repeats < 1:
    print('error: need --processes >= 2, --rounds >= 3, --repeats >= 1', file=sys.stderr)
    return 2
  n = a.processes
  layouts = [('1 process x 1 device', 1, 1), (f'1 process x {n} devices', 1, n),
             (f'{n} processes x 1 device', n, 1)]
  times = {name: [] for name, _, _ in layouts}
  with tempfile.TemporaryDirectory() as tmp:
    cache = os.path.join(tmp, 'jax_cache')
    for rep in range(a.repeats):
      for i, (name, procs, devs) in enumerate(layouts):
        t = run_layout(a.config, a.rounds, procs, devs, os.path.join(tmp, f'r{rep}_{i}'), cache)
        times[name].append(t)
        print(f'run {rep + 1} {name}: {t:.3f} s/round', flush=True)
  ref = statistics.median(times[layouts[1][0]])
  lines = [f'| layout | steady round, s (median of {a.repeats}) | runs | vs 1 process x {n} '
           'devices |', '|---|---|---|---|']
  for name, _, _ in layouts:
    med = statistics.median(times[name])
    lines.append(f'| {name} | {med:.3f} | {", ".join(f"{t:.3f}" for t in times[name])} '
                 f'| {med / ref:.2f}x |')
  print('\n'.join(lines))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, 'w') as f:
      json.dump({'config': a.config, 'rounds': a.rounds, 'times_s': times}, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
