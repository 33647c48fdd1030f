r"""Where a round's time goes: XLA's own per-operation times of one fedjax_kd round.

  python benchmarks/performance/profile_round.py --workload=many_fedavg --clients=100 --model=dsfl_cnn
  python benchmarks/performance/profile_round.py --workload=dsfl --top=15

Builds one of ``benchmarks/performance/vs_torch.py``'s workloads, plays a warm-up round (it
compiles), then plays ``--rounds`` more under ``jax.profiler.trace`` and reads the trace back: every
event of the XLA executor's threads, grouped by operation (the HLO instruction's name with its
numeric suffix removed, so the 40 copies of a fusion in an unrolled loop count as one), summed
over threads and rounds. The table gives each group's share of the summed time, its calls and
mean time, and the wall time of the traced rounds, so that ops that run in parallel on the
cores (summed time above wall time) are told apart from a serial tail. ``--out`` keeps the
rows as JSON; the trace itself stays in ``--trace_dir`` for Perfetto/TensorBoard.
"""

from __future__ import annotations

import argparse
import collections
import functools
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from typing import Any, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_torch  # pylint: disable=g-import-not-at-top,wrong-import-position

# Trace events that are not XLA operations: the runtime's own spans and Python frames.
_SKIP = re.compile(r'^(\$|ThunkExecutor|PjRt|Execute|TfrtCpu|end_|XlaModule|jit_|'
                   r'ExecuteHelper|ThreadpoolListenerCallback)')


def group_name(name: str) -> str:
  """An event's operation group: ``fusion.123`` -> ``fusion``, ``dot.7.clone`` -> ``dot``."""
  base = name.split(':')[0].strip()
  base = re.sub(r'(\.\d+)+(\.clone)*(\.\d+)*$', '', base)
  return re.sub(r'_\d+$', '', base) or name


def summarize(events: Sequence[dict[str, Any]], top: int) -> list[dict[str, Any]]:
  """Per-group totals of complete trace events (``ph == 'X'``, ``dur`` in microseconds)."""
  total = collections.Counter()
  calls = collections.Counter()
  for e in events:
    if e.get('ph') != 'X' or 'dur' not in e or _SKIP.match(str(e.get('name', ''))):
      continue
    g = group_name(str(e['name']))
    total[g] += float(e['dur'])
    calls[g] += 1
  summed = sum(total.values()) or 1.0
  return [{'op': g, 'share': t / summed, 'total_s': t / 1e6, 'calls': calls[g],
           'mean_ms': t / calls[g] / 1e3} for g, t in total.most_common(top)]


def read_trace(trace_dir: str) -> list[dict[str, Any]]:
  """The events of the newest ``*.trace.json.gz`` under ``trace_dir``."""
  files = sorted(glob.glob(os.path.join(trace_dir, '**', '*.trace.json.gz'), recursive=True),
                 key=os.path.getmtime)
  if not files:
    raise FileNotFoundError(f'no *.trace.json.gz under {trace_dir}')
  with gzip.open(files[-1], 'rt') as f:
    return json.load(f).get('traceEvents', [])


def profile(cfg, rounds: int, trace_dir: str, top: int) -> tuple[list[dict[str, Any]], float]:
  """Rows of :func:`summarize` for ``rounds`` rounds after a warm-up, and their wall time."""
  import jax  # pylint: disable=g-import-not-at-top
  _, exp, state = vs_torch.build(cfg)
  play = functools.partial(vs_torch.play, exp)
  state = play(state, 1)
  t0 = time.perf_counter()
  with jax.profiler.trace(trace_dir):
    for t in range(2, rounds + 2):
      state = play(state, t)
  wall = time.perf_counter() - t0
  return summarize(read_trace(trace_dir), top), wall


def table(rows: Sequence[dict[str, Any]], wall: float, rounds: int) -> str:
  out = [f'traced {rounds} round(s) in {wall:.2f} s of wall time; summed op time '
         f'{sum(r["total_s"] for r in rows):.2f} s in the top {len(rows)} groups', '',
         '| op | share | total s | calls | mean ms |', '|---|---|---|---|---|']
  for r in rows:
    out.append(f'| {r["op"]} | {100 * r["share"]:.1f}% | {r["total_s"]:.3f} | {r["calls"]} | '
               f'{r["mean_ms"]:.3f} |')
  return '\n'.join(out)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--workload', default='many_fedavg',
                 help=f'one of {", ".join(vs_torch.WORKLOADS)}')
  p.add_argument('--clients', type=int, default=0, help="0: the workload's default")
  p.add_argument('--model', default='dsfl_cnn', help='the many-clients workloads\' model')
  p.add_argument('--epochs', type=int, default=0)
  p.add_argument('--rounds', type=int, default=1, help='traced rounds after the warm-up')
  p.add_argument('--top', type=int, default=10)
  p.add_argument('--mnist', default=vs_torch.MNIST_DEFAULT)
  p.add_argument('--trace_dir', default='', help='keep the trace here (default: a temp dir)')
  p.add_argument('--out', default='', help='write the rows as JSON here')
  a = p.parse_args(argv)
  if a.workload not in vs_torch.WORKLOADS:
    print(f'error: --workload: {a.workload!r}; allowed: {", ".join(vs_torch.WORKLOADS)}',
          file=sys.stderr)
    return 2
  if a.model not in vs_torch.MANY_MODELS:
    print(f'error: --model: {a.model!r}; allowed: {", ".join(vs_torch.MANY_MODELS)}',
          file=sys.stderr)
    return 2
  if a.rounds < 1 or a.top < 1:
    print('error: --rounds and --top must be >= 1', file=sys.stderr)
    return 2
  with tempfile.TemporaryDirectory() as tmp:
    if a.workload in vs_torch.MANY:
      cfg, _ = vs_torch.many_config(vs_torch.MANY[a.workload], a, tmp,
                                    k=a.clients or vs_torch.MANY_CLIENTS[0], model=a.model)
    else:
      cfg, _ = vs_torch.CONFIGS[a.workload](a, tmp)
    rows, wall = profile(cfg, a.rounds, a.trace_dir or os.path.join(tmp, 'trace'), a.top)
  print(table(rows, wall, a.rounds))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, 'w') as f:
      json.dump({'wall_s': wall, 'rounds': a.rounds, 'rows': rows}, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
