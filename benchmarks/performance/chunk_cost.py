r"""What running clients in chunks costs: one config's round at C = K, K/2 and K/4 clients at a
time (``clients.chunk``), in one invocation, on whatever device JAX has.

  python benchmarks/performance/chunk_cost.py --mnist=/path/to/mnist.npz [--config=dsfl_mnist]
      [--fractions=1,0.5,0.25] [--repeats=3] [--out=F.json]
  python benchmarks/performance/chunk_cost.py --from_json=benchmarks/results/chunk_cost_cpu.json --markdown=docs/performance.md

Each (C, repeat) is a fresh process running round 1 of the config (``--config.rounds=1``, no
checkpoint, no compilation cache), interleaved over C so that drift on a shared machine falls
on every C alike. A round's time is its ``round_time_s`` less its ``compile_s`` (the
compilation of round 1 is not the chunks' cost). The table gives the median over the repeats
and its ratio to C = K. The config's data source is replaced by the Keras-layout MNIST file
given (``dsfl_mnist`` reads MNIST through tensorflow-datasets).
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
sys.path.insert(0, os.path.join(REPO, 'benchmarks', 'performance'))
import config_costs  # pylint: disable=g-import-not-at-top,wrong-import-position


def one_round(config: str, chunk: int, mnist: str, folder: str, tag: str) -> dict:
  """Round 1 of ``config`` at ``chunk`` clients at a time, in a fresh process."""
  work = os.path.join(folder, tag)
  cmd = [sys.executable, '-m', 'fedjax_kd.main', f'--config={config}', f'--workdir={work}',
         '--noresume', '--noprogress', '--compilation_cache=none', '--config.rounds=1',
         '--config.checkpoint.every=0', '--config.log.tensorboard=false',
         f'--config.clients.chunk={chunk}']
  if mnist:
    cmd.append(f'--config.data.source=npz:{os.path.abspath(mnist)}')
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise SystemExit(f'error: {" ".join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}')
  with open(os.path.join(work, 'metrics.jsonl')) as f:
    row = json.loads(f.readline())
  return {'round_s': row['round_time_s'] - row.get('compile_s', 0.0),
          'compile_s': row.get('compile_s', 0.0)}


BEGIN, END = '<!-- chunk-cost:begin -->', '<!-- chunk-cost:end -->'


def table(doc: dict) -> str:
  """The markdown table of a saved ``--out`` document: per C, the median round and its ratio
  to all clients at once, with the runs it is the median of."""
  out = [f'`{doc["config"]}`, K = {doc["clients"]}, on {doc.get("machine", "this machine")}: '
         f'a round (compilation excluded), median of {len(doc["rows"][0]["runs"])} fresh '
         'processes each',
         '', '| clients at a time | a round | against all at once | the runs |',
         '|---|---|---|---|']
  for r in doc['rows']:
    runs = ', '.join(f'{x:.0f}' for x in r['runs'])
    out.append(f'| {r["chunk"]} | {r["round_s"]:.0f} s | {r["ratio"]:.2f}x | {runs} s |')
  return '\n'.join(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  ap.add_argument('--config', default='dsfl_mnist')
  ap.add_argument('--fractions', default='1,0.5,0.25', help='C as fractions of K')
  ap.add_argument('--repeats', type=int, default=3)
  ap.add_argument('--mnist', default=os.environ.get(
      'FEDJAX_KD_MNIST', os.path.join(REPO, '..', 'shared', 'data', 'mnist.npz')))
  ap.add_argument('--out', default='')
  ap.add_argument('--from_json', default='', help='the table of a saved --out file')
  ap.add_argument('--markdown', default='',
                  help=f'write the table between {BEGIN} and {END} of this file')
  a = ap.parse_args(argv)
  sys.path.insert(0, REPO)
  return config_costs.table_main(a, measure, table, BEGIN, END)


def measure(a: argparse.Namespace) -> dict:
  """Every (C, repeat) round in a fresh process, interleaved over C."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  k = int(config_lib.load_file(a.config).clients.num_clients)
  chunks = [max(1, round(k * float(f))) for f in a.fractions.split(',')]
  mnist = a.mnist if os.path.exists(a.mnist) else ''
  runs: dict[int, list[dict]] = {c: [] for c in chunks}
  with tempfile.TemporaryDirectory(prefix='fedjax_kd_chunks_') as folder:
    for r in range(a.repeats):
      for c in chunks:
        runs[c].append(one_round(a.config, c, mnist, folder, f'c{c}_r{r}'))
        print(f'C={c} repeat {r + 1}: {runs[c][-1]["round_s"]:.1f} s', file=sys.stderr,
              flush=True)
  base = statistics.median(x['round_s'] for x in runs[chunks[0]])
  rows = []
  for c in chunks:
    med = statistics.median(x['round_s'] for x in runs[c])
    rows.append({'chunk': c, 'round_s': med, 'ratio': med / base,
                 'runs': [x['round_s'] for x in runs[c]]})
  return {'config': a.config, 'clients': k, 'machine': config_costs.machine(), 'rows': rows}


if __name__ == '__main__':
  sys.exit(main())
