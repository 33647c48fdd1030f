r"""An independent DS-FL in plain PyTorch, on fedjax_kd's exact data, partition and open-set draws.

  python benchmarks/torch_dsfl.py --mnist=/path/to/mnist.npz --seeds=0,1,2 \
      --aggregations=era,sa --out=runs/torch_dsfl [--rounds=15] [--threads=2]

DS-FL (S. Itahara, T. Nishio, Y. Koda, M. Morikura, K. Yamamoto, "Distillation-Based
Semi-Supervised Federated Learning for Communication-Efficient Collaborative Training With
Non-IID Private Data", IEEE TMC 2021, Algorithm 1) written the way the PyTorch FD code bases
run it: a Python loop over clients, ``torch.nn`` modules with PyTorch's default initialisation
and BatchNorm, ``torch.optim.SGD``, a fresh random permutation of each client's data every
epoch. It is the reference that fedjax_kd's learning curve is compared with, seed by seed.

What it shares with fedjax_kd, so that a pair of runs differs only in the implementation:

* the setting of ``configs/dsfl_mnist_cpu.py`` (or ``--config``): 20 clients x 200 private
  images in 2 label-sorted shards, the paper's CNN for every client and the server, SGD 0.1,
  5 private + 5 distillation epochs in batches of 100, ERA with T = 0.1 (or SA);
* for each seed, the same open/private/test split, the same partition and the same open
  samples ``o_r`` every round: all three are taken from ``fedjax_kd.experiment.build`` for that
  seed (the split and partition are numpy code; nothing of fedjax_kd's training is used).

What it does not share: the model initialisations, the shuffles and everything numerical
(``torch.manual_seed(seed)`` drives them), the framework, and the BatchNorm details (PyTorch
keeps the unbiased running variance; fedjax_kd the biased one, as Flax does).

One round, as Algorithm 1 (the paper's order):
  1. every client trains its own persistent model on its private data (cross-entropy);
  2. every client predicts ``o_r`` in inference mode (``model.eval()``) and uploads softmax
     probabilities;
  3. the server averages them (SA) and, for ERA, takes ``softmax(mean / T)``;
  4. every client and the server model distil on ``(o_r, labels)`` (soft-label cross-entropy,
     whose gradient equals that of ``KL(labels || student)``);
  5. the server model is scored on the test set in inference mode.

Outputs: ``--out`` is laid out as a ``fedjax_kd.sweep`` directory (``sweep.json``, and per run
``runs/<variant>/seed<k>/{config.json, metrics.jsonl, summary.json}``), so
``fedjax_kd.sweep.aggregate`` and the reproduction report read it like any sweep. Rows carry
``test_acc`` and the diagnostics fedjax_kd logs for DS-FL (``label_acc``, ``upload_acc``,
``entropy``) and ``round_time_s``. A finished run is skipped when the command is rerun.

PyTorch is a benchmark extra, never a dependency of fedjax_kd: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
from typing import Any, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
from fedjax_kd import sweep  # pylint: disable=g-import-not-at-top
from fedjax_kd import workdir as workdir_lib  # pylint: disable=g-import-not-at-top

CONFIG = 'configs/dsfl_mnist_cpu.py'
MNIST_DEFAULT = os.environ.get('FEDJAX_KD_MNIST', '')
LABELS = {'era': 'PyTorch DS-FL ERA', 'sa': 'PyTorch DS-FL SA'}
METRICS = ('label_acc', 'upload_acc', 'entropy')


# ------------------------------------------------------------ the shared setting
@dataclasses.dataclass(frozen=True)
class Setting:
  """Everything a pair of runs shares, as host arrays (images NHWC in [0, 1]).

  Attributes:
    x_private, y_private: the pooled private data.
    client_rows: per client, its rows of ``x_private``.
    x_public, y_public: the open set (its labels only feed the diagnostics).
    x_test, y_test: the server's test set.
    draws: ``[rounds, |o_r|]`` the open samples of each round.
    num_classes: number of classes.
    train: ``(epochs, batch_size, learning_rate)`` of private training.
    distill: ``(epochs, batch_size, learning_rate)`` of distillation.
    aggregation: ``'era'`` or ``'sa'``.
    temperature: ERA's T.
    config: the fedjax_kd config the setting was built from (JSON-able dict).
  """
  x_private: np.ndarray
  y_private: np.ndarray
  client_rows: tuple[np.ndarray, ...]
  x_public: np.ndarray
  y_public: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  draws: np.ndarray
  num_classes: int
  train: tuple[int, int, float]
  distill: tuple[int, int, float]
  aggregation: str
  temperature: float
  config: dict[str, Any]


def build_config(config_path: str, seed: int, aggregation: str, rounds: int | None = None,
                 overrides: Sequence[tuple[str, Any]] = ()):
  """The fedjax_kd config of one run: the config file, the aggregation, the seed, overrides."""
  cfg = config_lib.load_file(os.path.join(REPO, config_path)
                          if not os.path.isabs(config_path) else config_path)
  fields = [('dsfl.aggregation', aggregation), ('seed', seed), ('eval.clients', False),
            *overrides]
  if rounds is not None:
    fields.append(('rounds', rounds))
  return sweep.apply_overrides(cfg, fields)


def export_setting(cfg) -> Setting:
  """Builds fedjax_kd's experiment for ``cfg`` (no training) and takes its data and draws."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd import experiment  # pylint: disable=g-import-not-at-top
  spec = config_lib.validate(cfg)
  if spec.algorithm != 'dsfl':
    raise ValueError(f'algorithm: the reference runs DS-FL only, got {spec.algorithm!r}')
  exp = experiment.build(spec)
  d = exp.ctx.data
  idx, n = np.asarray(d.client_idx), np.asarray(d.client_n)
  tr, di = spec.train, spec.distill or spec.train
  draws = np.stack([exp.algorithm.sample_public(t)[0] for t in range(1, spec.rounds + 1)])
  return Setting(
      # Model inputs, as fedjax_kd's kernels see them (MNIST is stored as uint8 pixels).
      x_private=d.normalize.host(np.asarray(d.x_private)), y_private=np.asarray(d.y_private),
      client_rows=tuple(idx[k, :n[k]] for k in range(len(n))),
      x_public=d.normalize.host(np.asarray(d.x_public)), y_public=np.asarray(d.y_public),
      x_test=d.normalize.host(np.asarray(d.x_test)), y_test=np.asarray(d.y_test), draws=draws,
      num_classes=d.num_classes,
      train=(tr.epochs, tr.batch_size, tr.learning_rate),
      distill=(spec.distill_epochs, spec.distill_batch_size, di.learning_rate),
      aggregation=spec.options.aggregation, temperature=spec.options.temperature,
      config=json.loads(cfg.to_json_best_effort()))


# ------------------------------------------------------------ PyTorch
def make_model(num_classes: int, in_channels: int = 1):
  """DS-FL's MNIST CNN (583,242 trainable parameters) with PyTorch's defaults.

  Conv5x5(32) VALID -> BN -> ReLU -> MaxPool2 -> Conv5x5(64) VALID -> BN -> ReLU -> MaxPool2
  -> Dense(512) -> BN -> ReLU -> Dense(C).
  """
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  return nn.Sequential(
      nn.Conv2d(in_channels, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(4 * 4 * 64, 512), nn.BatchNorm1d(512), nn.ReLU(),
      nn.Linear(512, num_classes))


def _fit(model, x, targets, epochs: int, batch_size: int, lr: float, gen, soft: bool) -> float:
  """Minibatch SGD over ``(x, targets)``: a new permutation every epoch, partial last batch
  kept (as a DataLoader with ``shuffle=True``); returns the mean batch loss."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  model.train()
  opt = torch.optim.SGD(model.parameters(), lr=lr)
  n, losses = x.shape[0], []
  for _ in range(epochs):
    perm = torch.randperm(n, generator=gen)
    for i in range(0, n, batch_size):
      j = perm[i:i + batch_size]
      logits = model(x[j])
      if soft:
        loss = -(targets[j] * F.log_softmax(logits, 1)).sum(1).mean()
      else:
        loss = F.cross_entropy(logits, targets[j])
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      losses.append(loss.item())
  return float(np.mean(losses)) if losses else float('nan')


def _predict(model, x, chunk: int = 1000):
  import torch  # pylint: disable=g-import-not-at-top
  model.eval()
  with torch.no_grad():
    return torch.cat([torch.softmax(model(x[i:i + chunk]), 1)
                      for i in range(0, x.shape[0], chunk)])


def run(setting: Setting, seed: int, workdir: str, threads: int = 0,
        log=print) -> dict[str, Any]:
  """Runs DS-FL in PyTorch on ``setting``; writes the workdir; returns the summary."""
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  torch.manual_seed(seed)
  gen = torch.Generator().manual_seed(seed)
  nchw = lambda a: torch.from_numpy(np.array(np.moveaxis(a, -1, 1), np.float32))
  xp, yp = nchw(setting.x_private), torch.from_numpy(setting.y_private.astype(np.int64))
  x_pub, x_test = nchw(setting.x_public), nchw(setting.x_test)
  y_test = torch.from_numpy(setting.y_test.astype(np.int64))
  y_pub = torch.from_numpy(setting.y_public.astype(np.int64))
  c, k = setting.num_classes, len(setting.client_rows)
  clients = [make_model(c, xp.shape[1]) for _ in range(k)]
  server = make_model(c, xp.shape[1])
  data = [(xp[torch.from_numpy(r.astype(np.int64))], yp[torch.from_numpy(r.astype(np.int64))])
          for r in setting.client_rows]
  (e_tr, b_tr, lr_tr), (e_di, b_di, lr_di) = setting.train, setting.distill

  os.makedirs(workdir, exist_ok=True)
  writer = workdir_lib.MetricsWriter(workdir)   # an unfinished earlier call's rows go
  workdir_lib.write_json(os.path.join(workdir, 'config.json'),
                         {**setting.config, 'reference': 'benchmarks/torch_dsfl.py'}, indent=2)
  rows, t0 = [], time.time()
  for t, draw in enumerate(setting.draws, start=1):
    start = time.time()
    train_loss = np.mean([_fit(m, x, y, e_tr, b_tr, lr_tr, gen, soft=False)
                          for m, (x, y) in zip(clients, data)])
    j = torch.from_numpy(draw.astype(np.int64))
    x_or, y_or = x_pub[j], y_pub[j]
    probs = torch.stack([_predict(m, x_or) for m in clients])        # [K, n, C]
    mean = probs.mean(0)
    labels = torch.softmax(mean / setting.temperature, 1) if setting.aggregation == 'era' \
        else mean
    distill_loss = np.mean([_fit(m, x_or, labels, e_di, b_di, lr_di, gen, soft=True)
                            for m in clients])
    server_loss = _fit(server, x_or, labels, e_di, b_di, lr_di, gen, soft=True)
    acc = float((_predict(server, x_test).argmax(1) == y_test).float().mean())
    ent = float(-(labels * torch.log(labels.clamp_min(1e-30))).sum(1).mean())
    row = {'round': t, 'test_acc': acc,
           'label_acc': float((labels.argmax(1) == y_or).float().mean()),
           'upload_acc': float((probs.argmax(2) == y_or[None]).float().mean()),
           'entropy': ent, 'train_loss': float(train_loss), 'distill_loss': float(distill_loss),
           'server_distill_loss': server_loss, 'round_time_s': time.time() - start}
    rows.append(writer.write(row))
    log(f'{os.path.basename(os.path.dirname(workdir))}/{os.path.basename(workdir)} round {t}: '
        f'acc {acc:.4f} label_acc {row["label_acc"]:.3f} upload_acc {row["upload_acc"]:.3f} '
        f'({row["round_time_s"]:.1f} s)')
  summary = {'rounds': len(rows), 'final_acc': rows[-1]['test_acc'],
             'best_acc': max(r['test_acc'] for r in rows), 'wall_time_s': time.time() - t0,
             'seed': seed, 'aggregation': setting.aggregation,
             'torch': torch.__version__, 'threads': torch.get_num_threads()}
  workdir_lib.write_json(os.path.join(workdir, 'summary.json'), summary, indent=2)
  return summary


# ------------------------------------------------------------ sweeps
def plan(config_path: str, out: str, seeds: Sequence[int], aggregations: Sequence[str],
         rounds: int | None = None, overrides: Sequence[tuple[str, Any]] = ()
         ) -> list[sweep.Run]:
  """One run per (aggregation, seed), at ``<out>/runs/<variant>/seed<k>`` as a sweep lays out."""
  runs = []
  for g in aggregations:
    v = sweep.Variant(LABELS[g], 'dsfl', {'dsfl.aggregation': g})
    for s in seeds:
      runs.append(sweep.Run(v, (), s, os.path.join(out, sweep.RUNS_DIR, v.slug, f'seed{s}'),
                            build_config(config_path, s, g, rounds, overrides)))
  return runs


def execute(runs: Sequence[sweep.Run], threads: int = 0, log=print) -> list[dict[str, Any]]:
  """Runs every unfinished run (a finished one, by its ``summary.json``, is skipped).

  Each run's config must be a DS-FL config; its ``dsfl.aggregation`` and ``seed`` pick the
  variant. Returns the summaries in run order.
  """
  out = []
  for r in runs:
    summary = workdir_lib.read_json(r.workdir, 'summary.json')
    if sweep.is_complete(summary, r.rounds):
      log(f'{r.variant.label} seed {r.seed}: finished earlier (acc '
          f'{summary["final_acc"]:.4f}), skipped')
    else:
      summary = run(export_setting(r.config), r.seed, r.workdir, threads, log)
      log(f'{r.variant.label} seed {r.seed}: final {summary["final_acc"]:.4f} in '
          f'{summary["wall_time_s"]:.0f} s')
    out.append(summary)
  return out


# ------------------------------------------------------------ command line
def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--mnist', default=MNIST_DEFAULT,
                 help='MNIST .npz (Keras layout; default $FEDJAX_KD_MNIST)')
  p.add_argument('--config', default=CONFIG, help='a DS-FL config file (default %(default)s)')
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--aggregations', default='era,sa')
  p.add_argument('--rounds', type=int, default=None, help="default: the config's")
  p.add_argument('--threads', type=int, default=0, help='torch threads (0: its default)')
  p.add_argument('--out', required=True)
  p.add_argument('--set', action='append', default=[], metavar='FIELD=VALUE',
                 help='an override of the fedjax_kd config (e.g. clients.num_clients=4)')
  a = p.parse_args(argv)
  if not a.mnist:
    print('error: --mnist: give a Keras-layout mnist.npz (or set $FEDJAX_KD_MNIST)',
          file=sys.stderr)
    return 2
  if not os.path.exists(a.mnist):
    print(f'error: --mnist: {a.mnist} does not exist', file=sys.stderr)
    return 2
  seeds = [int(s) for s in a.seeds.split(',')]
  aggs = a.aggregations.split(',')
  bad = [g for g in aggs if g not in LABELS]
  if bad:
    print(f'error: --aggregations: {bad[0]!r}; allowed: {", ".join(LABELS)}', file=sys.stderr)
    return 2
  fixed, grid = sweep.parse_set(a.set)
  if grid:
    print('error: --set takes one value per field here', file=sys.stderr)
    return 2
  if importlib.util.find_spec('torch') is None:
    print('error: PyTorch is not installed (pip install -e .[bench]): it is a benchmark extra',
          file=sys.stderr)
    return 2
  overrides = [('data.source', f'npz:{os.path.abspath(a.mnist)}'), *fixed.items()]
  runs = plan(a.config, a.out, seeds, aggs, a.rounds, overrides)
  sweep.write_plan(a.out, runs, config=a.config, engine='torch', metrics=list(METRICS),
                   overrides=dict(overrides), thresholds=list(runs[0].config.comm.thresholds))
  execute(runs, a.threads)
  cells = sweep.aggregate(a.out)
  sweep.write_outputs(a.out, cells, thresholds=tuple(runs[0].config.comm.thresholds))
  return 0


if __name__ == '__main__':
  sys.exit(main())
