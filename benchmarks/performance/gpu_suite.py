r"""The headline speed workloads at paper size: fedjax_kd and a PyTorch loop on the same device.

  python benchmarks/performance/gpu_suite.py --out=runs/gpu_suite.json            # paper size (a GPU)
  python benchmarks/performance/gpu_suite.py --tiny --workload=blazefl --repeats=1  # minutes on a CPU

Workloads (paper size; ``--tiny`` shrinks clients, data and epochs so that a CPU runs them):

* ``blazefl``: BlazeFL's FedAvg quickstart: CIFAR-10 shaped, 100 clients x 500 images, all of
  them every round, 5 epochs of batch 50, McMahan et al.'s CNN (879k parameters).
* ``dsfl``: DS-FL's MNIST round with K = 100 clients x 200 private images, the paper's CNN, 1,000
  open samples, 5 + 5 epochs of batch 100, ERA, a server model.
* ``resnet20``: SCARLET's CIFAR-10 round with K = 100 ResNet-20 clients x 500 images, |P^t| =
  1,000, 5 + 5 epochs of batch 100, Enhanced ERA, a ResNet-20 server (cache and augmentation off,
  so that both sides do the same work).

Each is run by ``benchmarks/performance/vs_torch.py``'s two sides (same data, partition, models,
steps). The report gives, per workload, rounds per minute of each side, the ratio, the
floating-point work of a round and the rate fedjax_kd achieves, against the chip's dense peak where
it is known.

A round's work is counted from the model, not measured: the forward FLOPs of one example (XLA's
cost analysis of the model in inference mode) times the examples each phase processes, with a
training example counted as 3 forward passes (forward, and a backward of twice its cost):
FedAvg ``K * E * n``; DS-FL and SCARLET ``K * (3 E n + |P^t| + 3 E_d |P^t|)`` plus the server's
``3 E_d |P^t|``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
from typing import Any, Sequence

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_torch  # pylint: disable=g-import-not-at-top,wrong-import-position

WORKLOADS = ('blazefl', 'dsfl', 'resnet20')
# Dense (no sparsity) peaks in TFLOP/s, by substring of jax's device_kind: float32 on the CUDA
# cores and TF32 on the tensor cores (what XLA and cuBLAS use for float32 matmuls by default).
PEAKS = {'H100': {'fp32': 67.0, 'tf32': 494.7}, 'H200': {'fp32': 67.0, 'tf32': 494.7},
         'A100': {'fp32': 19.5, 'tf32': 156.0}}
# Memory bandwidth in TB/s (HBM3 of the H100 SXM, HBM3e of the H200, HBM2e of the A100 80GB):
# the other limit of the roofline, against the bytes a round moves (vs_torch.round_bytes).
HBM_TBPS = {'H100': 3.35, 'H200': 4.8, 'A100': 2.04}


def paper_args(tiny: bool) -> argparse.Namespace:
  """``vs_torch`` workload arguments: paper size, or a tiny size that a CPU runs in seconds."""
  return argparse.Namespace(clients=2 if tiny else 100, epochs=1 if tiny else 0,
                            mnist='' if tiny else vs_torch.MNIST_DEFAULT)


def peak_tflops(device_kind: str) -> dict[str, float]:
  """The dense float32/TF32 peaks of a device kind (empty when unknown, e.g. a CPU)."""
  for key, peaks in PEAKS.items():
    if key in device_kind:
      return peaks
  return {}


def run(names: Sequence[str], repeats: int, rounds: int, tiny: bool, log=print,
        torch_side: bool = True, torch_sides: Sequence[str] = vs_torch.TORCH_SIDES
        ) -> list[dict[str, Any]]:
  """Runs the workloads on fedjax_kd and each of ``torch_sides`` (fedjax_kd only without
  ``torch_side``); returns vs_torch's rows with the rates added."""
  import jax  # pylint: disable=g-import-not-at-top
  args = paper_args(tiny)
  kind = jax.devices()[0].device_kind
  log(f'device: {kind}')
  rows = []
  for name in names:
    row = vs_torch.run([name], repeats, rounds, 0, args, log=log, torch_side=torch_side,
                       torch_sides=torch_sides)[0]
    rows.append(_rates(row, kind))
  return rows


def _rates(row: dict[str, Any], kind: str) -> dict[str, Any]:
  """``row`` with rounds/min, TFLOP/s and the fractions of the chip's peaks added."""
  flops = row['round_gflop'] * 1e9
  pt = row['torch_round_s']
  peaks = peak_tflops(kind)
  row.update({
      'device_kind': kind, 'round_tflop': flops / 1e12,
      'fedjax_rounds_per_min': 60.0 / row['fedjax_round_s'],
      'torch_rounds_per_min': 60.0 / pt if pt else None,
      'fedjax_tflops': flops / row['fedjax_round_s'] / 1e12,
      'torch_tflops': flops / pt / 1e12 if pt else None,
  })
  for side in vs_torch.TORCH_SIDES[1:]:
    t = row.get(f'torch_{side}_round_s')
    row[f'torch_{side}_rounds_per_min'] = 60.0 / t if t else None
  for p, v in peaks.items():
    row[f'fedjax_{p}_peak_fraction'] = row['fedjax_tflops'] / v
  if row.get('round_gbytes'):   # the memory side: bytes moved a second against the bandwidth
    row['fedjax_tbytes_s'] = row['round_gbytes'] / row['fedjax_round_s'] / 1e3
    hbm = next((v for k, v in HBM_TBPS.items() if k in kind), None)
    row['fedjax_hbm_fraction'] = row['fedjax_tbytes_s'] / hbm if hbm else None
  return row


# The lines run() logs (through vs_torch.run): one per timed run and side, and the device.
_RUN_LINE = re.compile(r'^(\w+) K=(\d+) \S+ run \d+: (fedjax_kd|'
                       + '|'.join(re.escape(w) for w in sorted(vs_torch.SIDE_WORDS.values(),
                                                               key=len, reverse=True))
                       + r')\s+([0-9.]+) s/round')
# The batched sides' words in those lines -> their keys in vs_torch's rows.
_SIDE_WORDS = {w: side for side, w in vs_torch.SIDE_WORDS.items() if side != 'loop'}
_DEVICE_LINE = re.compile(r'^device: (.+)$')


def rows_from_logs(paths: Sequence[str], device_kind: str = '',
                   tiny: bool = False) -> list[dict[str, Any]]:
  """Rows rebuilt from the logs of runs that were stopped before they wrote their JSON.

  A device call has a deadline; a workload stopped in its last repeat has logged its finished
  runs but written no rows. This pools the runs of each workload over ``paths`` (the same
  machine), takes the medians, and counts a round's work at paper size on this machine (the
  count depends on the model and data sizes only; ``tiny`` for logs of ``--tiny`` runs).
  ``device_kind`` names the chip where the logs do not (logs written before run() logged it).

  Returns:
    gpu_suite rows (``fedjax_runs``/``torch_runs``: the pooled per-run round times).
  """
  found: dict[str, dict[str, Any]] = {}
  kind = device_kind
  for path in paths:
    with open(path) as f:
      for line in f:
        m = _DEVICE_LINE.match(line.strip())
        if m:
          kind = kind or m.group(1)
        m = _RUN_LINE.match(line.strip())
        if m:
          w = found.setdefault(m.group(1), {'clients': int(m.group(2)), 'fedjax_kd': [],
                                            **{word: [] for word in vs_torch.SIDE_WORDS.values()}})
          w[m.group(3)].append(float(m.group(4)))
  if not kind:
    raise ValueError('the logs do not name the device: pass device_kind')
  args = paper_args(tiny)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name, runs in found.items():
      cfg, desc = vs_torch.CONFIGS[name](args, tmp)
      spec, data = vs_torch.shapes(cfg)
      j = float(np.median(runs['fedjax_kd']))
      p = float(np.median(runs['pytorch'])) if runs['pytorch'] else None
      row = {'workload': name, 'data': desc, 'clients': runs['clients'],
             'fedjax_round_s': j, 'torch_round_s': p, 'ratio': p / j if p else None,
             'round_gflop': vs_torch.round_flops(spec, data) / 1e9,
             'round_gbytes': vs_torch.round_bytes(spec, data) / 1e9,
             'fedjax_runs': runs['fedjax_kd'], 'torch_runs': runs['pytorch']}
      for word, side in _SIDE_WORDS.items():
        v = float(np.median(runs[word])) if runs[word] else None
        row.update({f'torch_{side}_round_s': v, f'torch_{side}_ratio': v / j if v else None,
                    f'torch_{side}_runs': runs[word]})
      rows.append(_rates(row, kind))
  return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
  """A markdown table of the suite's rows; where a row has a batched PyTorch side, two more
  columns give its rounds/min (eager / compiled) and fedjax_kd's speed-up over it."""
  vmap = any(r.get(f'torch_{side}_round_s') for r in rows for side in _SIDE_WORDS.values())
  extra = (' PyTorch vmap rounds/min (eager / compiled) | speed-up over vmap (eager / '
           'compiled) |' if vmap else '')
  out = ['| workload | clients | device | fedjax_kd rounds/min | PyTorch rounds/min | speed-up | '
         'TFLOP/round | fedjax_kd TFLOP/s | of TF32 peak | GB moved/round (model) | '
         'of HBM bandwidth | runs (fedjax_kd / PyTorch) |' + extra,
         '|---|---|---|---|---|---|---|---|---|---|---|---|' + ('---|---|' if vmap else '')]
  num = lambda v, fmt: '-' if v is None else format(v, fmt)
  for r in rows:
    frac, hbm = r.get('fedjax_tf32_peak_fraction'), r.get('fedjax_hbm_fraction')
    torch_rpm = '-' if r['ratio'] is None else f'{r["torch_rounds_per_min"]:.2f}'
    ratio = '-' if r['ratio'] is None else f'{r["ratio"]:.2f}x'
    out.append(f'| {r["workload"]} | {r["clients"]} | {r["device_kind"]} | '
               f'{r["fedjax_rounds_per_min"]:.2f} | {torch_rpm} | '
               f'{ratio} | {r["round_tflop"]:.3f} | {r["fedjax_tflops"]:.3f} | '
               f'{"-" if frac is None else f"{100 * frac:.1f}%"} | '
               f'{num(r.get("round_gbytes"), ".1f")} | '
               f'{"-" if hbm is None else f"{100 * hbm:.1f}%"} | '
               f'{len(r["fedjax_runs"])} / {len(r["torch_runs"])} |')
    if vmap:
      out[-1] += (f' {num(r.get("torch_vmap_rounds_per_min"), ".2f")} / '
                  f'{num(r.get("torch_vmap_compiled_rounds_per_min"), ".2f")} | '
                  f'{num(r.get("torch_vmap_ratio"), ".2f")}x / '
                  f'{num(r.get("torch_vmap_compiled_ratio"), ".2f")}x |')
  return '\n'.join(out)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--workload', default='all', help=f'one of {", ".join(WORKLOADS)} or all')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--rounds', type=int, default=2, help='timed rounds after the warm-up round')
  p.add_argument('--tiny', action='store_true', help='CPU-sized workloads (tests, smoke runs)')
  p.add_argument('--no_torch', action='store_true',
                 help='fedjax_kd only (the PyTorch columns stay empty)')
  p.add_argument('--torch_sides', default=','.join(vs_torch.TORCH_SIDES),
                 help='PyTorch sides, comma-separated, of ' + ', '.join(vs_torch.TORCH_SIDES))
  p.add_argument('--out', default='', help='write the rows as JSON here')
  p.add_argument('--from_logs', default='',
                 help='comma-separated logs of runs stopped before writing their JSON: the '
                      'table of their finished runs (nothing is run)')
  p.add_argument('--device_kind', default='', help='with --from_logs: the chip, where the '
                                                   'logs do not name it')
  a = p.parse_args(argv)
  if a.from_logs:
    paths = a.from_logs.split(',')
    missing = [x for x in paths if not os.path.isfile(x)]
    if missing:
      print(f'error: --from_logs: no file {missing[0]!r}', file=sys.stderr)
      return 2
    try:
      rows = rows_from_logs(paths, a.device_kind, a.tiny)
    except ValueError as e:
      print(f'error: --device_kind: {e}', file=sys.stderr)
      return 2
    print(table(rows))
    return 0
  names = WORKLOADS if a.workload == 'all' else tuple(a.workload.split(','))
  bad = [w for w in names if w not in WORKLOADS]
  if bad:
    print(f'error: --workload: {bad[0]!r}; allowed: {", ".join(WORKLOADS)}, all', file=sys.stderr)
    return 2
  for flag in ('repeats', 'rounds'):
    if getattr(a, flag) < 1:
      print(f'error: --{flag} must be >= 1', file=sys.stderr)
      return 2
  if not a.no_torch and importlib.util.find_spec('torch') is None:
    print('error: PyTorch is not installed (pip install -e .[bench], or --no_torch): it is a '
          'benchmark extra', file=sys.stderr)
    return 2
  sides = tuple(v for v in a.torch_sides.split(',') if v)
  if not sides or any(v not in vs_torch.TORCH_SIDES for v in sides):
    print(f'error: --torch_sides={a.torch_sides!r}: comma-separated, of '
          f'{", ".join(vs_torch.TORCH_SIDES)}', file=sys.stderr)
    return 2
  rows = run(names, a.repeats, a.rounds, a.tiny, torch_side=not a.no_torch, torch_sides=sides)
  print(table(rows))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, 'w') as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
