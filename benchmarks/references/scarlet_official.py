r"""The SCARLET authors' own PyTorch code, run on fedjax_kd's exact data, partition and draws.

  python benchmarks/references/scarlet_official.py --checkout=/path/to/SCARLET --mnist=/path/to/mnist.npz \
      --seeds=0,1,2 --algorithms=scarlet,dsfl --out=runs/scarlet_official [--rounds=5] \
      [--threads=1]

An independent reference for fedjax_kd's SCARLET and DS-FL: the official implementation of
K. Azuma, T. Nishio, Y. Kitagawa, W. Nakano, T. Tanimura, "Soft-Label Caching and Sharpening
for Communication-Efficient Federated Distillation" (IEEE TMC 2026), branch ``main`` of the
authors' repository (``src/scarlet``: DS-FL and SCARLET, ResNet-20, torch process pool). Not one
line of it is in this repository: ``--checkout`` names a clone, which is put on ``sys.path``
and run through its own entry point ``scarlet.main.main(cfg)``. What this file changes in it,
at run time only (the checkout's files are never written), is listed in ``PATCHES`` and in
docs/scarlet_official.md:

  P1 ``wandb`` is a stub module whose ``init()`` returns this driver's metrics recorder (the
     pipeline's ``logger.log(summary, step)`` then writes ``metrics.jsonl``);
  P2 ``CommonPartitionedDataset._preprocess`` writes fedjax_kd's rows (private per client,
     public set, server test set, per-client test sets) in the authors' on-disk layout, as
     their own ``FilteredDataset`` objects, instead of downloading CIFAR-10/100 and running
     their Dirichlet partition; everything that reads the data is theirs;
  P3 ``scarlet.models.selector.resnet20``: the authors' ResNet-20 with a 1-channel stem
     (MNIST), or with ``--model=cnn`` fedjax_kd's ``cnn@1.0`` in torch.nn (PyTorch's
     default initialisation; fedjax_kd then runs ``model.init=torch``), in this process and
     in every pool worker;
  P4 ``CommonServerHandler.get_next_indices``: the round's public draw is fedjax_kd's
     ``sample_public(t)`` instead of ``torch.randperm`` (SCARLET still decides, with its own
     cache, which of them are requested);
  I1 (instrumentation, no effect on training) the server handler's ``downlink_package`` and
     ``load`` are wrapped to count the bytes of the tensors exchanged and to read the cache.

What it shares with fedjax_kd, so that a pair of runs differs only in the implementation:
the setting of ``configs/scarlet_mnist_cpu.py`` with ``ResNet-20`` for every client and the
server (``MATCHING_OVERRIDES``), i.e. 10 clients x 200 private MNIST images, client Dirichlet
alpha = 0.05, |P| = 3000 public images carved from the training set, |P^t| = 300 a round,
D = 20, beta = 2 (SCARLET), T = 0.1 (DS-FL ERA), SGD 0.1, 5 + 5 epochs in batches of 50,
symmetric normalisation ((x - 0.5) / 0.5), no augmentation; for each seed the same split,
partition, per-client test sets and public draws, all taken from
``fedjax_kd.running.experiment.build``.

Each (algorithm, seed) runs in a fresh Python process (``--_run``, internal) so the patches,
their logging handlers and the torch pool never meet fedjax_kd's JAX. The output is a
``fedjax_kd.sweep`` directory: ``sweep.json``, ``runs/<variant>/seed<k>/{config.json,
metrics.jsonl, summary.json, official.log}``; a finished run is skipped on rerun.

Needs a Python with torch, torchvision, tyro and tqdm besides fedjax_kd (their imports; wandb is
stubbed). See docs/scarlet_official.md for the environment that works.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import types
from typing import Any, Sequence

try:   # a Python without numpy gets the one-line error of main() below
  import numpy as np
except ImportError:   # pragma: no cover
  np = None

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = 'configs/scarlet_mnist_cpu.py'
MNIST_DEFAULT = os.environ.get('FEDJAX_KD_MNIST', '')
# fedjax_kd's config fields that make its run the same experiment as the authors' code here.
MODEL = 'resnet20@1.0'
MATCHING_OVERRIDES = (('clients.models', (MODEL,)), ('server.model', MODEL))
# --model: what every client and the server run in the authors' code, and the fedjax_kd fields
# that make fedjax_kd's run the same experiment. 'cnn' is fedjax_kd's cnn@1.0 (the CPU
# setting's own model) written in torch.nn, with PyTorch's default initialisation on both
# sides: a round takes seconds instead of ResNet-20's minutes.
OFFICIAL_MODELS = {
    'resnet20': MATCHING_OVERRIDES,
    'cnn': (('clients.models', ('cnn@1.0',)), ('server.model', 'cnn@1.0'),
            ('model.init', 'torch')),
}
MODEL_ENV = 'SCARLET_OFFICIAL_MODEL'   # set in a run process: pool workers build this model
# A run of ResNet-20 on one CPU thread takes ~3 minutes a round here (docs/scarlet_official.md):
# 5 rounds keep one run within roughly 15 minutes. ``--rounds=30`` is the config's own length.
DEFAULT_ROUNDS = 5
LABELS = {'scarlet': 'SCARLET (official code)', 'dsfl': 'DS-FL ERA (official code)'}
METRICS = ('hit_ratio',)   # client_acc is a column of every sweep table already
CHILD_ENV = 'SCARLET_OFFICIAL_CHECKOUT'   # set in a run process: pool workers apply P3
SCRATCH = 'official_scratch'              # in a run's workdir: their data split and states
LOG = 'official.log'
THREAD_VARS = ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS')

PATCHES = (
    ('P1', 'scarlet/main.py', 'import wandb / wandb.init',
     'a stub module: init() returns the driver\'s recorder, so logger.log(summary, step) '
     'writes metrics.jsonl (wandb is not installed, and disabled wandb logs nothing)'),
    ('P2', 'scarlet/dataset/dataset.py', 'CommonPartitionedDataset._preprocess',
     'writes fedjax_kd\'s rows in their layout (TRAIN_PRIVATE/<cid>.pkl, TRAIN_PUBLIC/public.pkl, '
     'TEST/test.pkl, TEST/<cid>.pkl) as their FilteredDataset, already normalised, without '
     'transform; instead of CIFAR-10/100 downloads, their partition and flip/crop augmentation'),
    ('P3', 'scarlet/models/selector.py', 'resnet20 (the name CommonModelSelector calls)',
     'their ResNet-20 with conv1 = Conv2d(1, 16, 3, padding=1, bias=False), Kaiming-normal '
     '(--model=resnet20), or fedjax_kd\'s cnn@1.0 in torch.nn with PyTorch\'s default init '
     '(--model=cnn); built inside their seeded fork_rng, so every client and the server still '
     'start equal; applied in the run process and in each spawned pool worker'),
    ('P4', 'scarlet/algorithm/common.py', 'CommonServerHandler.get_next_indices',
     'returns fedjax_kd\'s draw sample_public(round + 1) (300 sorted indices) instead of '
     'randperm(|P|)[:300]; SCARLET\'s override still filters it through its cache'),
    ('I1', 'scarlet/algorithm/{dsfl,scarlet,common}.py',
     'DSFLServerHandler/SCARLETServerHandler.downlink_package, CommonServerHandler.load',
     'wrapped (call the original, then measure): tensor bytes sent and received, the cache '
     'hits of the round; no effect on training'),
)


def _error(flag: str, message: str) -> int:
  print(f'error: {flag}: {message}', file=sys.stderr)
  return 2


def _thread_env(threads: int) -> dict[str, str]:
  env = dict(os.environ)
  if threads > 0:
    env.update({v: str(threads) for v in THREAD_VARS})
  env['TQDM_DISABLE'] = '1'   # their per-round client progress bar
  env['PYTHONUNBUFFERED'] = '1'
  return env


# ------------------------------------------------------------ the shared setting
def build_config(config_path: str, algorithm: str, seed: int, rounds: int | None,
                 overrides: Sequence[tuple[str, Any]] = (), model: str = 'resnet20'):
  """The fedjax_kd config a run matches: the file, the algorithm, the model, seed, rounds."""
  from fedjax_kd import config as config_lib   # pylint: disable=g-import-not-at-top
  from fedjax_kd import sweep   # pylint: disable=g-import-not-at-top
  path = config_path if os.path.isabs(config_path) else os.path.join(REPO, config_path)
  cfg = config_lib.load_file(path)
  fields = [('algorithm', algorithm), *OFFICIAL_MODELS[model], ('seed', seed), *overrides]
  if rounds is not None:
    fields.append(('rounds', rounds))
  return sweep.apply_overrides(cfg, fields)


def fedjax_command(config_path: str, overrides: Sequence[tuple[str, Any]]) -> str:
  """The ``python -m fedjax_kd.main`` line of the matching fedjax_kd run."""
  def show(v):
    if isinstance(v, (tuple, list)):
      return '"(' + ''.join(f"'{x}'," for x in v) + ')"'
    return str(v)
  return ' '.join(['python -m fedjax_kd.main', f'--config={config_path}'] +
                  [f'--config.{k}={show(v)}' for k, v in overrides])


def check_spec(spec, model: str = 'resnet20') -> None:
  """Refuses (ValueError) what the authors' code cannot run as fedjax_kd would."""
  problems = []
  if spec.algorithm not in LABELS:
    problems.append(f'algorithm: the official code runs {" and ".join(LABELS)}, not '
                    f'{spec.algorithm!r}')
  for name, o in (('train', spec.train), ('distill', spec.distill.optimizer or spec.train)):
    if o.optimizer != 'sgd' or o.momentum or o.weight_decay or o.lr_decay != 1.0:
      problems.append(f'{name}: plain SGD only (their torch.optim.SGD(lr) has no momentum, '
                      f'weight decay or decay)')
  if spec.partial:
    problems.append('clients.participation: 1.0 only (their sample_ratio draws with its own '
                    'random.Random)')
  if spec.data.augment != 'none':
    problems.append('data.augment: none only (P2 feeds prepared tensors)')

  def is_model(m: str) -> bool:
    name, _, width = m.partition('@')
    return name == model and float(width or 1) == 1.0
  if not all(is_model(m) for m in (*spec.clients.models, spec.server.model)):
    problems.append(f'clients.models / server.model: {model}@1.0 only (--model={model})')
  if problems:
    raise ValueError('; '.join(problems))


def export_setting(cfg, path: str) -> dict[str, Any]:
  """Builds fedjax_kd's experiment for ``cfg`` (no training); saves its data and draws.

  Writes ``path`` (npz: model inputs NCHW float32 as fedjax_kd's kernels see them, client
  rows, per-client test rows, the draws of every round) and returns the hyper-parameters
  that the authors' ``Config`` takes.
  """
  from fedjax_kd import config as config_lib   # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import experiment  # pylint: disable=g-import-not-at-top
  spec = config_lib.validate(cfg)
  check_spec(spec, spec.server.model.partition('@')[0])
  tr = spec.train
  di = spec.distill.optimizer or spec.train
  exp = experiment.build(spec)
  d = exp.ctx.data
  nchw = lambda a: np.ascontiguousarray(  # noqa: E731
      np.moveaxis(d.normalize.host(np.asarray(a)), -1, 1), np.float32)
  idx, n = np.asarray(d.client_idx), np.asarray(d.client_n)
  arrays: dict[str, np.ndarray] = {
      'x_private': nchw(d.x_private), 'y_private': np.asarray(d.y_private, np.int64),
      'x_public': nchw(d.x_public), 'x_test': nchw(d.x_test),
      'y_test': np.asarray(d.y_test, np.int64),
      'draws': np.stack([np.asarray(exp.algorithm.sample_public(t)[0], np.int64)
                         for t in range(1, spec.rounds + 1)])}
  for k in range(len(n)):
    arrays[f'client{k}'] = np.asarray(idx[k, :n[k]], np.int64)
  if d.test_idx is not None:
    t_idx, t_n = np.asarray(d.test_idx), np.asarray(d.test_n)
    for k in range(len(t_n)):
      arrays[f'test{k}'] = np.asarray(t_idx[k, :t_n[k]], np.int64)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  np.savez(path, **arrays)
  opts = spec.options
  return {
      'algorithm': spec.algorithm, 'seed': spec.seed, 'rounds': spec.rounds,
      'num_clients': spec.clients.num_clients, 'num_classes': int(d.num_classes),
      'public_size': int(arrays['x_public'].shape[0]),
      'public_size_per_round': int(arrays['draws'].shape[1]),
      'epochs': tr.epochs, 'batch_size': tr.batch_size, 'lr': tr.learning_rate,
      'kd_epochs': spec.distill.epochs, 'kd_batch_size': spec.distill.batch_size,
      'kd_lr': di.learning_rate,
      'enhanced_era_exponent': getattr(opts, 'beta', None),
      'cache_duration': opts.cache.duration if spec.algorithm == 'scarlet' else None,
      'era_temperature': getattr(opts, 'temperature', None),
      'per_client_test': d.test_idx is not None}


# ------------------------------------------------------------ inside a run process
def _checkout_src(checkout: str) -> str:
  return os.path.join(os.path.abspath(checkout), 'src')


def _cnn(num_classes: int = 10, **unused):
  """fedjax_kd's ``cnn@1.0`` in torch.nn, PyTorch's default initialisation: Conv5x5(16)
  SAME -> ReLU -> MaxPool2 -> Conv5x5(32) SAME -> ReLU -> MaxPool2 -> Dense(128) -> ReLU ->
  Dense(C), on 28x28x1 inputs."""
  del unused
  from torch import nn   # pylint: disable=g-import-not-at-top
  return nn.Sequential(
      nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(16, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, num_classes))


def _patch_model_stem(model: str = 'resnet20') -> None:
  """P3: what their selector builds under the name ``resnet20`` (called inside their seeded
  fork_rng, so every client and the server start equal): their ResNet-20 with conv1 taking
  1 channel, or with ``model='cnn'`` :func:`_cnn`."""
  import torch   # pylint: disable=g-import-not-at-top
  from scarlet.models import selector   # pylint: disable=g-import-not-at-top
  if getattr(selector.resnet20, '_scarlet_official', False):
    return
  original = selector.resnet20

  def resnet20(**kwargs):
    if model == 'cnn':
      return _cnn(**kwargs)
    net = original(**kwargs)
    net.conv1 = torch.nn.Conv2d(1, 16, kernel_size=3, stride=1, padding=1, bias=False)
    torch.nn.init.kaiming_normal_(net.conv1.weight)   # their _weights_init
    return net

  resnet20._scarlet_official = True
  selector.resnet20 = resnet20


if __name__ == '__mp_main__' and os.environ.get(CHILD_ENV):
  # A spawned worker of a run process (their torch.multiprocessing pool, or the Manager):
  # multiprocessing imports the parent's main module, this file, under this name before the
  # worker takes a job, so P3 is in place when their worker builds its model.
  if _checkout_src(os.environ[CHILD_ENV]) not in sys.path:
    sys.path.insert(0, _checkout_src(os.environ[CHILD_ENV]))
  if os.environ.get('OMP_NUM_THREADS') == '1':   # intra-op threads follow the variable
    import torch   # pylint: disable=g-import-not-at-top
    torch.set_num_interop_threads(1)
  _patch_model_stem(os.environ.get(MODEL_ENV, 'resnet20'))


class _Meter:
  """I1: what the server sends and receives in a round, and SCARLET's cache, by measurement."""

  def __init__(self):
    self.reset()

  def reset(self):
    self.start = time.time()
    self.up = self.down = 0
    self.requested = self.drawn = self.cached = None

  @staticmethod
  def tensor_bytes(package) -> int:
    import torch   # pylint: disable=g-import-not-at-top
    total = 0
    for f in dataclasses.fields(package):
      v = getattr(package, f.name)
      if isinstance(v, torch.Tensor):
        total += v.element_size() * v.nelement()
    return total


def _install(setting: dict[str, np.ndarray], params: dict[str, Any], recorder) -> None:
  """Applies P1, P2, P3, P4 and I1 in this (the run) process."""
  import torch   # pylint: disable=g-import-not-at-top

  # P1: wandb.
  stub = types.ModuleType('wandb')
  stub.init = lambda *args, **kwargs: recorder   # noqa: ARG005
  stub.__doc__ = 'scarlet_official.py: stub (P1)'
  sys.modules['wandb'] = stub

  from scarlet.algorithm import common, dsfl, scarlet   # pylint: disable=g-import-not-at-top
  from scarlet.core import FilteredDataset   # pylint: disable=g-import-not-at-top
  from scarlet.dataset import dataset as dataset_mod   # pylint: disable=g-import-not-at-top

  # P2: the data.
  def _preprocess(self):
    kinds = dataset_mod.CommonPartitionType
    self.root.mkdir(parents=True, exist_ok=True)
    for type_ in kinds:
      self.path.joinpath(type_.value).mkdir(parents=True)
    self.num_classes = int(params['num_classes'])
    if self.num_clients != params['num_clients']:
      raise ValueError(f'num_clients {self.num_clients} != the setting\'s '
                       f'{params["num_clients"]}')
    if self.public_train_size != setting['x_public'].shape[0]:
      raise ValueError(f'public_train_size {self.public_train_size} != the setting\'s '
                       f'{setting["x_public"].shape[0]}')

    def save(x: np.ndarray, y: np.ndarray | None, where):
      data = torch.from_numpy(np.array(x, np.float32))   # own storage, only these rows
      targets = None if y is None else [int(v) for v in y]
      torch.save(FilteredDataset(list(range(len(data))), data, targets, transform=None), where)

    xp, yp = setting['x_private'], setting['y_private']
    for cid in range(self.num_clients):
      rows = setting[f'client{cid}']
      save(xp[rows], yp[rows], self.path.joinpath(kinds.TRAIN_PRIVATE, f'{cid}.pkl'))
    xt, yt = setting['x_test'], setting['y_test']
    for cid in range(self.num_clients):
      rows = setting.get(f'test{cid}')
      rows = np.arange(len(yt)) if rows is None else rows
      save(xt[rows], yt[rows], self.path.joinpath(kinds.TEST, f'{cid}.pkl'))
    save(xt, yt, self.path.joinpath(kinds.TEST, 'test.pkl'))
    save(setting['x_public'], None, self.path.joinpath(kinds.TRAIN_PUBLIC, 'public.pkl'))

  dataset_mod.CommonPartitionedDataset._preprocess = _preprocess

  # P3: the model (here; the pool workers apply it through CHILD_ENV and MODEL_ENV).
  _patch_model_stem(params.get('model', 'resnet20'))

  # P4: the public draw.
  draws = setting['draws']

  def get_next_indices(self):
    return torch.as_tensor(draws[self.round], dtype=torch.int64)

  common.CommonServerHandler.get_next_indices = get_next_indices

  # I1: measurement.
  meter = recorder.meter

  def wrap_downlink(original):
    def downlink_package(self):
      meter.reset()
      package = original(self)
      meter.down = _Meter.tensor_bytes(package) * self.num_clients_per_round
      meter.requested = int(package.next_indices.numel())
      meter.drawn = int(len(draws[self.round]))
      if hasattr(self, 'cached_indices'):
        meter.cached = len(self.cached_indices)
      return package
    return downlink_package

  def wrap_load(original):
    def load(self, payload):
      meter.up += _Meter.tensor_bytes(payload)
      recorder.handler = self
      return original(self, payload)
    return load

  for cls in (dsfl.DSFLServerHandler, scarlet.SCARLETServerHandler):
    cls.downlink_package = wrap_downlink(cls.downlink_package)
  common.CommonServerHandler.load = wrap_load(common.CommonServerHandler.load)


class _Recorder:
  """What their pipeline logs to (``wandb.init`` returns it): one metrics row a round."""

  def __init__(self, workdir: str, rounds: int):
    from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
    self.writer = workdir_lib.MetricsWriter(workdir)
    self.rounds = rounds
    self.meter = _Meter()
    self.handler = None
    self.cum = {'up': 0, 'down': 0}
    self.rows: list[dict[str, Any]] = []

  def log(self, data: dict[str, float], step: int | None = None) -> None:
    m = self.meter
    self.cum['up'] += m.up
    self.cum['down'] += m.down
    row: dict[str, Any] = {
        'round': int(step) + 1,
        'test_acc': float(data['server_test_acc']), 'test_loss': float(data['server_test_loss']),
        'client_acc': float(data['client_test_acc']),
        'client_loss': float(data['client_test_loss']),
        'up_bytes': m.up, 'down_bytes': m.down, 'round_bytes': m.up + m.down,
        'cum_bytes': self.cum['up'] + self.cum['down'], 'cum_up_bytes': self.cum['up'],
        'cum_down_bytes': self.cum['down'], 'requested': m.requested,
    }
    signals = getattr(self.handler, 'cache_signals', None)
    if m.cached is not None:   # SCARLET
      row['hit_ratio'] = m.cached / m.drawn
      names = ('n_cached', 'n_newly_cached', 'n_expired')   # their CacheSignal 0, 1, 2
      counts = np.bincount(np.asarray(signals.tolist(), np.int64), minlength=3)
      row.update({k: int(c) for k, c in zip(names, counts)})
      row['signal_hit_ratio'] = row['n_cached'] / m.drawn
    row['server_distill_loss'] = getattr(self.handler, 'public_train_loss', None)
    row['round_time_s'] = time.time() - m.start
    self.rows.append(self.writer.write(row))
    hit = f' hit {row["hit_ratio"]:.3f}' if 'hit_ratio' in row else ''
    print(f'[scarlet_official] round {row["round"]}/{self.rounds}: test_acc '
          f'{row["test_acc"]:.4f} client_acc {row["client_acc"]:.4f}{hit} bytes '
          f'{row["round_bytes"]} cum {row["cum_bytes"]} ({row["round_time_s"]:.1f} s)',
          flush=True)


def run_process(workdir: str, checkout: str, threads: int) -> int:
  """``--_run``: one prepared run, in this fresh process, through their ``main(cfg)``."""
  for path in (REPO, _checkout_src(checkout)):
    if path not in sys.path:
      sys.path.insert(0, path)
  import torch   # pylint: disable=g-import-not-at-top
  import torch.multiprocessing as mp   # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  if threads > 0:
    torch.set_num_threads(threads)
    torch.set_num_interop_threads(1)
  scratch = os.path.join(workdir, SCRATCH)
  params = workdir_lib.read_json(scratch, 'params.json')
  with np.load(os.path.join(scratch, 'setting.npz')) as z:
    setting = {k: z[k] for k in z.files}
  os.environ[CHILD_ENV] = os.path.abspath(checkout)
  os.environ[MODEL_ENV] = params.get('model', 'resnet20')
  mp.set_start_method('spawn')   # as their entry point does
  recorder = _Recorder(workdir, params['rounds'])
  _install(setting, params, recorder)

  from pathlib import Path   # pylint: disable=g-import-not-at-top
  import scarlet.main as their_main   # pylint: disable=g-import-not-at-top
  from scarlet import config as their_config   # pylint: disable=g-import-not-at-top
  if params['algorithm'] == 'scarlet':
    algorithm = their_config.SCARLETConfig(
        enhanced_era_exponent=params['enhanced_era_exponent'],
        cache_duration=params['cache_duration'])
  else:
    algorithm = their_config.DSFLConfig(era_temperature=params['era_temperature'])
  common = their_config.CommonConfig(
      dataset_root_dir=Path(scratch, 'dataset'), state_root_dir=Path(scratch, 'state'),
      seed=params['seed'], num_clients=params['num_clients'],
      public_size=params['public_size'], global_round=params['rounds'],
      epochs=params['epochs'], batch_size=params['batch_size'], lr=params['lr'],
      kd_epochs=params['kd_epochs'], kd_batch_size=params['kd_batch_size'],
      kd_lr=params['kd_lr'], public_size_per_round=params['public_size_per_round'],
      sample_ratio=1.0, num_parallels=1)
  cfg = their_config.Config(algorithm=algorithm, common=common,
                            wandb=their_config.WandBConfig(mode='disabled'))
  t0 = time.time()
  their_main.main(cfg)
  wall = time.time() - t0
  rows = recorder.rows
  if len(rows) != params['rounds']:
    print(f'error: their pipeline stopped after {len(rows)} of {params["rounds"]} rounds',
          file=sys.stderr)
    return 1
  summary = {
      'rounds': len(rows), 'final_acc': rows[-1]['test_acc'],
      'best_acc': max(r['test_acc'] for r in rows), 'wall_time_s': wall,
      'seed': params['seed'], 'algorithm': params['algorithm'],
      'final_client_acc': rows[-1]['client_acc'], 'cum_bytes': rows[-1]['cum_bytes'],
      'cum_up_bytes': rows[-1]['cum_up_bytes'], 'cum_down_bytes': rows[-1]['cum_down_bytes'],
      'comm_rules': 'tensor bytes (element_size * numel), downlink times receivers',
      'round_time_s_mean': float(np.mean([r['round_time_s'] for r in rows])),
      'torch': torch.__version__, 'threads': torch.get_num_threads(),
      'python': sys.version.split()[0],
      # Their main.py trains on CUDA whenever torch sees a GPU (else MPS, else the CPU).
      'device': ({'platform': 'gpu', 'kind': torch.cuda.get_device_name(0)}
                 if torch.cuda.is_available() else {'platform': 'mps', 'kind': 'mps'}
                 if torch.backends.mps.is_available() else {'platform': 'cpu', 'kind': 'cpu'})}
  workdir_lib.write_json(os.path.join(workdir, 'summary.json'), summary, indent=2)
  return 0


# ------------------------------------------------------------ the sweep
def _git(checkout: str, *args: str) -> str | None:
  try:
    out = subprocess.run(['git', '-C', checkout, *args], capture_output=True, text=True,
                         check=True, timeout=30)
    return out.stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return None


def plan(config_path: str, out: str, seeds: Sequence[int], algorithms: Sequence[str],
         rounds: int | None, overrides: Sequence[tuple[str, Any]] = (),
         model: str = 'resnet20'):
  """One run per (algorithm, seed) at ``<out>/runs/<variant>/seed<k>``, as a sweep lays out."""
  from fedjax_kd import sweep   # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib   # pylint: disable=g-import-not-at-top
  runs = []
  for a in algorithms:
    v = sweep.Variant(LABELS[a], a, dict(OFFICIAL_MODELS[model]))
    for s in seeds:
      cfg = build_config(config_path, a, s, rounds, overrides, model)
      check_spec(config_lib.validate(cfg), model)
      runs.append(sweep.Run(v, (), s, os.path.join(out, sweep.RUNS_DIR, v.slug, f'seed{s}'),
                            cfg))
  return runs


def _log(line: str) -> None:
  print(line, flush=True)


def child_command(workdir: str, checkout: str, threads: int) -> list[str]:
  """The command of the process that runs one run of the authors' code.

  The child runs in the run's directory, so every path it gets is absolute (a relative
  ``--out`` would otherwise be resolved twice).
  """
  return [sys.executable, os.path.abspath(__file__), f'--_run={os.path.abspath(workdir)}',
          f'--checkout={os.path.abspath(checkout)}', f'--threads={threads}']


def execute(runs, checkout: str, config_path: str, threads: int,
            overrides: Sequence[tuple[str, Any]] = (), log=_log) -> list[Any]:
  """Runs every unfinished run in its own process; a finished one is skipped."""
  from fedjax_kd import sweep   # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  checkout = os.path.abspath(checkout)
  source = {'checkout': checkout, 'commit': _git(checkout, 'rev-parse', 'HEAD'),
            'branch': _git(checkout, 'rev-parse', '--abbrev-ref', 'HEAD'),
            'dirty': bool(_git(checkout, 'status', '--porcelain', '--untracked-files=no'))}
  results = []
  for r in runs:
    summary = workdir_lib.read_json(r.workdir, 'summary.json')
    name = f'{r.variant.label} seed {r.seed}'
    if sweep.is_complete(summary, r.rounds):
      log(f'{name}: finished earlier (acc {summary["final_acc"]:.4f}), skipped')
      results.append(summary)
      continue
    scratch = os.path.join(r.workdir, SCRATCH)
    shutil.rmtree(scratch, ignore_errors=True)   # an unfinished run starts again from round 1
    for f in ('summary.json', 'metrics.jsonl', 'metrics.csv'):
      if os.path.exists(os.path.join(r.workdir, f)):
        os.remove(os.path.join(r.workdir, f))
    params = export_setting(r.config, os.path.join(scratch, 'setting.npz'))
    params['model'] = str(r.config.server.model).partition('@')[0]   # P3's choice
    params['matching_fedjax_kd_command'] = fedjax_command(
        config_path, [('algorithm', r.variant.algorithm), *r.variant.overrides,
                      ('seed', r.seed), ('rounds', r.rounds), *overrides])
    workdir_lib.write_json(os.path.join(scratch, 'params.json'), params, indent=2)
    config = json.loads(r.config.to_json_best_effort())
    config.update({'reference': 'benchmarks/references/scarlet_official.py', 'official': {
        **source, 'their_config': {k: v for k, v in params.items()
                                   if k not in ('matching_fedjax_kd_command',)},
        'matching_fedjax_kd_command': params['matching_fedjax_kd_command'],
        'patches': [dict(zip(('id', 'file', 'what', 'why'), p)) for p in PATCHES]}})
    workdir_lib.write_json(os.path.join(r.workdir, 'config.json'), config, indent=2)
    log(f'{name}: starting ({r.rounds} rounds) -> {r.workdir}')
    cmd = child_command(r.workdir, checkout, threads)
    t0 = time.time()
    with open(os.path.join(r.workdir, LOG), 'w', encoding='utf-8') as f, subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=_thread_env(threads), cwd=r.workdir) as proc:
      for line in proc.stdout:
        f.write(line)
        f.flush()
        if line.startswith('[scarlet_official]') or 'error' in line.lower() \
            or 'Traceback' in line:
          log(f'  {line.rstrip()}')
      rc = proc.wait()
    summary = workdir_lib.read_json(r.workdir, 'summary.json')
    if rc != 0 or not sweep.is_complete(summary, r.rounds):
      log(f'{name}: FAILED (exit {rc}); see {os.path.join(r.workdir, LOG)}')
      results.append(None)
      continue
    shutil.rmtree(scratch, ignore_errors=True)
    log(f'{name}: final {summary["final_acc"]:.4f} in {time.time() - t0:.0f} s')
    results.append(summary)
  return results


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--checkout', default='',
                 help="a clone of the authors' SCARLET repository, branch main")
  p.add_argument('--mnist', default=MNIST_DEFAULT,
                 help='MNIST .npz (Keras layout; default $FEDJAX_KD_MNIST)')
  p.add_argument('--config', default=CONFIG, help='a SCARLET config file (default %(default)s)')
  p.add_argument('--seeds', default='0,1,2')
  p.add_argument('--algorithms', default='scarlet,dsfl')
  p.add_argument('--model', default='resnet20',
                 help=f'what every client and the server run: {", ".join(OFFICIAL_MODELS)} '
                 '(default %(default)s)')
  p.add_argument('--rounds', type=int, default=DEFAULT_ROUNDS,
                 help='rounds (default %(default)s; 0: the config\'s own)')
  p.add_argument('--threads', type=int, default=1,
                 help='torch threads in each run process and its workers (0: torch default)')
  p.add_argument('--out', default='')
  p.add_argument('--set', action='append', default=[], metavar='FIELD=VALUE',
                 help='an override of the fedjax_kd config (e.g. cache.duration=10)')
  p.add_argument('--_run', default='', help=argparse.SUPPRESS)
  a = p.parse_args(argv)
  if a._run:   # pylint: disable=protected-access
    return run_process(a._run, a.checkout, a.threads)   # pylint: disable=protected-access

  if not a.checkout:
    return _error('--checkout', "give a clone of the authors' repository "
                  '(git clone .../SCARLET; branch main)')
  if not os.path.isdir(a.checkout):
    return _error('--checkout', f'{a.checkout} is not a directory')
  if not os.path.exists(os.path.join(_checkout_src(a.checkout), 'scarlet', 'main.py')):
    return _error('--checkout', f'{a.checkout} has no src/scarlet/main.py (this driver runs '
                  "the authors' main branch; the reproducibility branch has another layout)")
  if not a.mnist:
    return _error('--mnist', 'give a Keras-layout mnist.npz (or set $FEDJAX_KD_MNIST)')
  if not os.path.exists(a.mnist):
    return _error('--mnist', f'{a.mnist} does not exist')
  if not a.out:
    return _error('--out', 'give an output directory')
  missing = [m for m in ('torch', 'torchvision', 'tyro', 'tqdm', 'numpy', 'jax')
             if importlib.util.find_spec(m) is None]
  if missing:
    return _error('torch', f'{", ".join(missing)} not importable from {sys.executable}: the '
                  "authors' code needs torch, torchvision, tyro and tqdm, and fedjax_kd "
                  'must be installed beside them (docs/scarlet_official.md has the steps)')
  try:
    seeds = [int(s) for s in a.seeds.split(',') if s.strip()]
  except ValueError:
    return _error('--seeds', f'{a.seeds!r}: comma-separated integers')
  algorithms = [x.strip() for x in a.algorithms.split(',') if x.strip()]
  bad = [x for x in algorithms if x not in LABELS]
  if bad or not algorithms:
    return _error('--algorithms', f'{bad[0] if bad else a.algorithms!r}; allowed: '
                  f'{", ".join(LABELS)}')
  if a.model not in OFFICIAL_MODELS:
    return _error('--model', f'{a.model!r}; allowed: {", ".join(OFFICIAL_MODELS)}')
  if a.rounds < 0:
    return _error('--rounds', f'{a.rounds}: a positive number, or 0 for the config\'s')
  if a.threads == 1:   # fedjax_kd builds the setting with JAX in this process
    os.environ.setdefault('XLA_FLAGS', '--xla_cpu_multi_thread_eigen=false '
                          'intra_op_parallelism_threads=1')
  os.environ.setdefault('JAX_PLATFORMS', 'cpu')
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from fedjax_kd import sweep   # pylint: disable=g-import-not-at-top
  from fedjax_kd.errors import ConfigError   # pylint: disable=g-import-not-at-top
  try:
    fixed, grid = sweep.parse_set(a.set)
  except ConfigError as e:
    return _error('--set', str(e))
  if grid:
    return _error('--set', 'one value per field here')
  overrides = [('data.source', f'npz:{os.path.abspath(a.mnist)}'), *fixed.items()]
  try:
    runs = plan(a.config, a.out, seeds, algorithms, a.rounds or None, overrides, a.model)
  except (ConfigError, ValueError) as e:
    return _error('--set', str(e))
  sweep.write_plan(a.out, runs, config=a.config, engine='torch (official SCARLET code)',
                   metrics=list(METRICS), overrides={**dict(overrides),
                                                    **dict(OFFICIAL_MODELS[a.model])},
                   thresholds=list(runs[0].config.comm.thresholds),
                   meta={'checkout': os.path.abspath(a.checkout),
                         'commit': _git(a.checkout, 'rev-parse', 'HEAD')})
  results = execute(runs, a.checkout, a.config, a.threads, overrides)
  cells = sweep.aggregate(a.out)
  sweep.write_outputs(a.out, cells, thresholds=tuple(runs[0].config.comm.thresholds))
  return 0 if all(r is not None for r in results) else 1


if __name__ == '__main__':
  sys.exit(main())
