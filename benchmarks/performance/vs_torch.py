r"""fedjax_kd against PyTorch, side by side on the same workload: a loop over clients, and the
clients batched with ``torch.func.vmap`` (eager and ``torch.compile``'d).

  python benchmarks/performance/vs_torch.py --workload=all --repeats=3 --out=runs/vs_torch.json
  python benchmarks/performance/vs_torch.py --workload=dsfl --repeats=3 --threads=2 \
      --torch_sides=loop,vmap,vmap_compiled

One process runs each workload with fedjax_kd and then with each PyTorch side, ``--repeats``
times, alternating, so that all see the same machine state. Every side gets the same data
(fedjax_kd's split and partition, exported to numpy), the same models (layer for layer,
parameter for parameter), the same optimiser (plain SGD), batch sizes, epochs and number of
samples per phase, so that they execute the same number of minibatch steps of the same shapes.
The PyTorch sides (``--torch_sides``, default ``loop,vmap``):

* ``loop``: the way the peer FD code bases run: a Python loop over clients, ``torch.nn``
  modules, ``torch.optim.SGD``, a random permutation of each client's data every epoch;
* ``vmap``: the way a strong PyTorch engineer batches clients: every client's parameters
  stacked (``torch.func.stack_module_state``), one ``vmap(grad(functional_call))`` SGD step for
  all clients at once, each client with its own permutation (:func:`time_torch_vmap`);
* ``vmap_compiled``: the same steps through ``torch.compile`` (TF32 allowed on a GPU, as XLA
  uses it by default).

Workloads (CPU sizes by default; ``--clients``/``--epochs`` change them):

* ``dsfl``: the DS-FL paper round (Itahara et al., IEEE TMC 2021) as ``configs/dsfl_mnist_cpu.py``
  runs it: 20 clients x 200 private MNIST images in 2 label-sorted shards, the paper's CNN
  (``dsfl_cnn``, 583k parameters) for every client and the server, 1,000 open samples a round,
  5 private + 5 distillation epochs in batches of 100, ERA (T = 0.1). Real MNIST from ``--mnist``
  when present, else MNIST-shaped random images.
* ``resnet20``: SCARLET's round (Azuma et al., arXiv 2504.19602) with its CIFAR-10 client model,
  ResNet-20 (option-A shortcuts, 270k parameters), on CIFAR-shaped random images: ``--clients``
  clients x 500 private images, |P^t| = 1,000 public samples, 5 + 5 epochs in batches of 100,
  Enhanced ERA, a ResNet-20 server model. The soft-label cache is off on both sides (with it,
  fedjax_kd would request fewer samples than the loop computes) and so is augmentation.
* ``blazefl``: BlazeFL's FedAvg quickstart (CIFAR-10 shaped, McMahan et al.'s CNN with 879k
  parameters, 500 images a client, 5 epochs of batch 50, SGD 0.1); ``--clients`` clients take
  part each round (100 at paper size).

* ``many_fedavg`` and ``many_dsfl``: the regime federated simulation is about (LEAF/FEMNIST
  style): ``--many_clients`` clients (100 and 1,000) of ~100 MNIST images each in 2 label-sorted
  shards, every client every round, batches of 10, ``--epochs`` local epochs (1 by default),
  plain SGD, one row per client count and model of ``--many_models`` (the DS-FL paper's
  ``dsfl_cnn`` and LEAF's FEMNIST CNN ``leaf_cnn``). MNIST's 60,000 training images hold 100 a
  client up to K = 590 beside DS-FL's open set; at K = 1,000 a client holds 59. DS-FL draws as
  many open samples a round as a client holds private ones and distils them in the same
  batches and epochs, with ERA (T = 0.1) and a server model of the same architecture.

Timing: each side runs ``--rounds`` + 1 rounds; the first is a warm-up (fedjax_kd compiles in it)
and is reported separately; the others are timed one by one, each ending when its results are
on the host. Evaluation is excluded on both sides. The table gives, per workload, the median
over repeats of each side's mean round time and the ratio PyTorch / fedjax_kd (> 1: fedjax_kd
is faster). PyTorch is a benchmark extra, never a dependency: ``pip install -e '.[bench]'``.

Roofline: each row also gives the floating-point work of a round, counted from the model (the
forward FLOPs of one example from XLA's cost analysis, times the examples each phase
processes, a training example counting 3 forward passes: :func:`round_examples`), the rate
each side achieves, and this machine's peak measured in the same run: a large float32 matrix
product through XLA and through PyTorch (:func:`peak_gflops`). A side far below the peak
spends its time elsewhere than in the products.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
  sys.path.insert(0, REPO)
MNIST_DEFAULT = os.environ.get('FEDJAX_KD_MNIST', '')   # else MNIST-shaped random data
WORKLOADS = ('dsfl', 'resnet20', 'blazefl', 'many_fedavg', 'many_dsfl')
MANY_CLIENTS = (100, 1000)             # --many_clients default
MANY_MODELS = ('dsfl_cnn', 'leaf_cnn')  # --many_models default
MANY_PER_CLIENT = 100                  # private images a client holds, where MNIST has them
MANY_BATCH = 10                        # the FL-standard local batch (LEAF, McMahan et al.)
MNIST_TRAIN = 60_000


# ------------------------------------------------------------ configs
def random_npz(path: str, shape: tuple[int, ...], n_train: int, n_test: int) -> str:
  """A Keras-layout npz of uniform random uint8 images with 10 labels (timing only)."""
  rs = np.random.RandomState(0)
  np.savez(path, x_train=rs.randint(0, 256, (n_train,) + shape, dtype=np.uint8),
           y_train=rs.randint(0, 10, n_train).astype(np.uint8),
           x_test=rs.randint(0, 256, (n_test,) + shape, dtype=np.uint8),
           y_test=rs.randint(0, 10, n_test).astype(np.uint8))
  return f'npz:{path}'


def _quiet(c) -> Any:
  c.eval.every = 10**9
  c.eval.clients = False
  c.checkpoint.every = 0
  c.log.tensorboard = False
  return c


def mnist_source(args, tmp: str) -> tuple[str, str]:
  """Real MNIST from ``--mnist`` when the file is there, else MNIST-shaped random images."""
  if args.mnist and os.path.isfile(args.mnist):
    return f'npz:{os.path.abspath(args.mnist)}', 'real MNIST'
  return (random_npz(os.path.join(tmp, 'mnist.npz'), (28, 28), MNIST_TRAIN, 1_000),
          'MNIST-shaped random images')


def dsfl_config(args, tmp: str):
  """configs/dsfl_mnist_cpu.py, with ``--clients`` clients of 200 private images."""
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  source, desc = mnist_source(args, tmp)
  c = presets.dsfl_paper_cpu(source)
  k = args.clients or 20
  c.clients.num_clients = k
  c.data.num_private = 200 * k
  if args.epochs:
    c.train.epochs = c.distill.epochs = args.epochs
  return _quiet(c), desc


def resnet20_config(args, tmp: str):
  """SCARLET's CIFAR-10 round (ResNet-20 clients and server) at ``--clients`` clients."""
  from fedjax_kd.config import presets  # pylint: disable=g-import-not-at-top
  k = args.clients or 4
  c = presets.scarlet_paper('cifar10', 0.05)
  c.data.source = random_npz(os.path.join(tmp, 'cifar.npz'), (32, 32, 3), 500 * k + 2_000, 500)
  c.data.public_source = ''
  c.data.num_public = 2_000
  c.data.num_private = 500 * k
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.data.per_client_test = False
  c.data.augment = 'none'
  c.clients.num_clients = k
  c.cache.mode = 'off'
  c.comm.thresholds = []
  if args.epochs:
    c.train.epochs = c.distill.epochs = args.epochs
  return _quiet(c), 'CIFAR-shaped random images'


def blazefl_config(args, tmp: str):
  """BlazeFL quickstart-fedavg with ``--clients`` clients, all of them every round."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  k = args.clients or 10
  c = config_lib.default_config()
  c.algorithm = 'fedavg'
  c.data.source = random_npz(os.path.join(tmp, 'cifar.npz'), (32, 32, 3), 500 * k, 500)
  c.data.num_public = 0
  c.data.num_private = 500 * k
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.clients.num_clients = k
  c.clients.models = ('blazefl_cnn',)
  c.server.model = ''
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.1
  c.train.momentum = 0.0
  c.train.batch_size = 50
  c.train.epochs = args.epochs or 5
  return _quiet(c), 'CIFAR-shaped random images'


def many_per_client(k: int, public: int) -> int:
  """Private images a client of the many-clients workload holds (100 where MNIST has them)."""
  return min(MANY_PER_CLIENT, (MNIST_TRAIN - public) // k)


def many_config(algorithm: str, args, tmp: str, k: int, model: str):
  """``k`` clients of ~100 MNIST images, batches of 10, all of them every round."""
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  source, desc = mnist_source(args, tmp)
  dsfl = algorithm == 'dsfl'
  public = 1_000 if dsfl else 0
  n = many_per_client(k, public)
  c = config_lib.default_config()
  c.algorithm = algorithm
  c.data.source = source
  c.data.num_public = public
  c.data.num_private = n * k
  c.data.partition = 'shards'
  c.data.shards_per_client = 2
  c.clients.num_clients = k
  c.clients.models = [f'{model}@1.0']
  c.server.model = f'{model}@1.0' if dsfl else ''
  c.train.optimizer = 'sgd'
  c.train.learning_rate = 0.05
  c.train.momentum = 0.0
  c.train.batch_size = MANY_BATCH
  c.train.epochs = args.epochs or 1
  if dsfl:
    c.dsfl.aggregation = 'era'
    c.dsfl.temperature = 0.1
    c.distill.public_per_round = n
    c.distill.batch_size = MANY_BATCH
    c.distill.epochs = c.train.epochs
  return _quiet(c), f'{desc}, {n} a client'


CONFIGS: dict[str, Callable[..., Any]] = {
    'dsfl': dsfl_config, 'resnet20': resnet20_config, 'blazefl': blazefl_config}
MANY = {'many_fedavg': 'fedavg', 'many_dsfl': 'dsfl'}


def cases(names: Sequence[str], args) -> list[tuple[str, Callable[[str], Any]]]:
  """``(workload, tmp -> (config, data description))`` per table row: one per workload,
  and one per client count and model of each many-clients workload."""
  out = []
  for name in names:
    if name in MANY:
      for k in args.many_clients:
        for m in args.many_models:
          out.append((name, functools.partial(many_config, MANY[name], args, k=k, model=m)))
    else:
      out.append((name, functools.partial(CONFIGS[name], args)))
  return out


# ------------------------------------------------------------ fedjax_kd side
def build(cfg):
  """(spec, experiment, initial state) of a config."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.running import experiment  # pylint: disable=g-import-not-at-top
  spec = config_lib.validate(cfg)
  exp = experiment.build(spec)
  state = exp.algorithm.init()
  jax.block_until_ready(state)
  return spec, exp, state


def shapes(cfg):
  """(spec, data) of a config without building it: the data's class count, input shape and
  clients' sizes (what :func:`round_flops` and :func:`round_bytes` read), from the prepared
  split alone; no models, no memory plan, nothing initialised."""
  import types  # pylint: disable=g-import-not-at-top
  from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
  from fedjax_kd.data import prepare  # pylint: disable=g-import-not-at-top
  spec = config_lib.validate(cfg)
  p = prepare.prepare(spec.data, num_clients=spec.clients.num_clients, seed=spec.seed)
  return spec, types.SimpleNamespace(num_classes=p.split.num_classes,
                                     input_shape=tuple(p.split.x_private.shape[1:]),
                                     client_n=np.array([len(ix) for ix in p.client_indices]))


def play(exp, state, t: int):
  """Round ``t`` of a built experiment, its result on the host's side of the device."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.algorithms import base  # pylint: disable=g-import-not-at-top
  algo, selector = exp.algorithm, exp.ctx.selector
  active = selector.plan(t, lambda mask, st=state: algo.selection_losses(st, mask)).active
  state, _ = base.play_round(algo, state, t, active)
  return jax.block_until_ready(state)


def time_fedjax(cfg, rounds: int, count_flops: bool = False) -> dict[str, Any]:
  """Round times of fedjax_kd: a warm-up round (compilation) and ``rounds`` timed rounds;
  with ``count_flops`` also the work of a round (:func:`round_flops`)."""
  t0 = time.perf_counter()
  spec, exp, state = build(cfg)
  build_s = time.perf_counter() - t0
  times = []
  for t in range(1, rounds + 2):
    t0 = time.perf_counter()
    state = play(exp, state, t)
    times.append(time.perf_counter() - t0)
  out = {'build_s': build_s, 'first_round_s': times[0], 'round_times_s': times[1:],
         'round_s': float(np.mean(times[1:]))}
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats() or {}   # a GPU's allocator; None on a CPU
  if 'peak_bytes_in_use' in stats:
    out['peak_device_bytes'] = int(stats['peak_bytes_in_use'])
  if count_flops:
    out['round_flop'] = round_flops(spec, exp.ctx.data)
    out['round_bytes'] = round_bytes(spec, exp.ctx.data)
  return out


# ------------------------------------------------------------ work accounting
@functools.lru_cache(maxsize=None)
def forward_cost(model: str, num_classes: int, input_shape: tuple[int, ...], batch: int = 1,
                 lowering: str = 'im2col') -> dict[str, float]:
  """XLA's cost analysis (on the CPU) of a forward pass of ``batch`` examples in inference mode:
  ``flops``, ``bytes`` (bytes accessed: parameters and activations read and written) and
  ``param_bytes`` (the float32 parameters alone). ``lowering`` of the convolutions: ``im2col``
  (the CPU's) counts their FLOPs as products; ``xla`` (the GPU's) reads and writes what a
  convolution kernel does, without im2col's patch matrices.

  Counted on the CPU on every machine: on a GPU, XLA hands convolutions to cuDNN as custom
  calls, which its cost analysis counts as 0 FLOPs (a CNN's count would be its dense layers).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from fedjax_kd.models import registry  # pylint: disable=g-import-not-at-top
  module = registry.get_model(model, num_classes=num_classes, input_shape=tuple(input_shape),
                              lowering=lowering)
  cpu = jax.devices('cpu')[0]
  x = jax.device_put(jnp.zeros((batch,) + tuple(input_shape), jnp.float32), cpu)
  variables = jax.device_put(module.init(jax.random.PRNGKey(0), x[:1], train=False), cpu)
  compiled = jax.jit(lambda v, x: module.apply(v, x, train=False)).lower(variables, x).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  params = sum(4 * int(np.prod(np.shape(a))) for a in jax.tree.leaves(variables['params']))
  return {'flops': float(cost['flops']), 'bytes': float(cost['bytes accessed']),
          'param_bytes': float(params)}


def forward_flops(model: str, num_classes: int, input_shape: Sequence[int]) -> float:
  """FLOPs of one example's forward pass in inference mode (:func:`forward_cost`)."""
  return forward_cost(model, num_classes, tuple(input_shape))['flops']


def round_examples(algorithm: str, client_n: Sequence[int], epochs: int, public: int = 0,
                   distill_epochs: int = 0, server: bool = False) -> float:
  """Forward-pass equivalents of one round (a training example counts 3).

  Args:
    algorithm: 'fedavg', or a public-set method ('dsfl', 'scarlet').
    client_n: private examples of each participating client.
    epochs: local epochs.
    public: samples predicted and distilled a round (|P^t|).
    distill_epochs: distillation epochs.
    server: whether a server model distils too.

  Returns:
    The number of example forward passes a round costs.
  """
  n = float(np.sum(client_n))
  if algorithm == 'fedavg':
    return 3.0 * epochs * n
  k = len(client_n)
  per_public = public + 3.0 * distill_epochs * public
  return 3.0 * epochs * n + k * per_public + (3.0 * distill_epochs * public if server else 0.0)


def round_flops(spec, data) -> float:
  """FLOPs of one round of a built experiment (``spec``, ``exp.ctx.data``)."""
  fwd = forward_flops(spec.clients.models[0], data.num_classes, data.input_shape)
  fedavg = spec.algorithm == 'fedavg'
  ex = round_examples(spec.algorithm, np.asarray(data.client_n), spec.train.epochs,
                      0 if fedavg else spec.distill.public_per_round,
                      0 if fedavg else spec.distill.epochs,
                      bool(spec.server.model) and not fedavg)
  return fwd * ex


def round_bytes(spec, data) -> float:
  """Bytes one round moves through device memory, by a model of its steps (the memory side of
  the roofline; a GPU profile's memory traffic is its check).

  A training step of ``B`` examples on one client moves 3 x ``A(B)`` (the forward's bytes
  accessed with the GPU's convolutions, :func:`forward_cost`, measured at 1 and 2 examples
  and extended linearly: the parameters are read once, the activations per example; the backward reads and writes about twice what the forward
  does) plus 3 x the parameters (plain SGD reads the parameters and the gradient and writes the
  parameters). Per round: every client's ``ceil(n_k / B) x epochs`` training steps; for a
  public-set method also each client's prediction of the round's open samples (one pass) and
  the clients' and the server's ``ceil(|P^t| / B_d) x E_d`` distillation steps; FedAvg adds
  reading every client's parameters and writing the average.
  """
  model, c, shape = spec.clients.models[0], data.num_classes, tuple(data.input_shape)
  p = forward_cost(model, c, shape)['param_bytes']

  one, two = (forward_cost(model, c, shape, b, 'xla')['bytes'] for b in (1, 2))

  def forward(batch: int) -> float:   # parameters once, activations per example: linear in B
    return one + (batch - 1) * (two - one)

  def step(batch: int) -> float:
    return 3.0 * forward(batch) + 3.0 * p

  tr = spec.train
  n = np.asarray(data.client_n)
  total = float(np.sum(np.ceil(n / tr.batch_size))) * tr.epochs * step(tr.batch_size)
  if spec.algorithm == 'fedavg':
    return total + (len(n) + 1) * p
  pub, db = spec.distill.public_per_round, spec.distill.batch_size
  students = len(n) + (1 if spec.server.model else 0)
  total += len(n) * forward(pub)
  return total + students * np.ceil(pub / db) * spec.distill.epochs * step(db)


def peak_gflops(n: int = 2048, repeats: int = 5, threads: int = 0,
                torch: bool = True) -> dict[str, float]:
  """This machine's float32 matrix-product rate: the median of ``repeats`` ``n x n x n``
  products through XLA (jax's default device) and, with ``torch``, through PyTorch (when
  installed)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  flop = 2.0 * n ** 3
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32)
  mm = jax.jit(jnp.matmul)
  mm(a, a).block_until_ready()
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    mm(a, a).block_until_ready()
    times.append(time.perf_counter() - t0)
  out = {'xla': flop / float(np.median(times)) / 1e9}
  if torch and importlib.util.find_spec('torch') is not None:
    import torch as pt  # pylint: disable=g-import-not-at-top
    if threads:
      pt.set_num_threads(threads)
    dev = pt.device('cuda' if pt.cuda.is_available() else 'cpu')
    sync = pt.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
    b = pt.randn(n, n, device=dev)
    pt.mm(b, b)
    sync()
    times = []
    for _ in range(repeats):
      t0 = time.perf_counter()
      pt.mm(b, b)
      sync()
      times.append(time.perf_counter() - t0)
    out['torch'] = flop / float(np.median(times)) / 1e9
  return out


# ------------------------------------------------------------ PyTorch side
def torch_model(name: str, num_classes: int, in_channels: int):
  """The PyTorch twin of a fedjax_kd model spec (same layers and parameter counts)."""
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  name = name.split('@')[0]
  if name == 'dsfl_cnn':
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 5), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(4 * 4 * 64, 512), nn.BatchNorm1d(512), nn.ReLU(),
        nn.Linear(512, num_classes))
  if name == 'leaf_cnn':
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(7 * 7 * 64, 2048), nn.ReLU(), nn.Linear(2048, num_classes))
  if name == 'blazefl_cnn':
    return nn.Sequential(
        nn.Conv2d(in_channels, 32, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(5 * 5 * 64, 512), nn.ReLU(), nn.Linear(512, num_classes))
  if name == 'resnet20':

    class Block(nn.Module):

      def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.pad = cout - cin
        self.stride = stride

      def forward(self, x):
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        s = x
        if self.stride != 1 or self.pad:   # option A: subsample, zero-pad the channels
          s = F.pad(x[:, :, ::self.stride, ::self.stride], (0, 0, 0, 0, 0, self.pad))
        return F.relu(y + s)

    layers: list[Any] = [nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                         nn.ReLU()]
    cin = 16
    for i, cout in enumerate((16, 32, 64)):
      for j in range(3):
        layers.append(Block(cin, cout, 2 if (i and not j) else 1))
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes)]
    return nn.Sequential(*layers)
  raise ValueError(f'no PyTorch twin for model {name!r}')


def _fit(model, x, targets, epochs: int, batch_size: int, lr: float, gen, soft: bool) -> None:
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  model.train()
  opt = torch.optim.SGD(model.parameters(), lr=lr)
  n = x.shape[0]
  for _ in range(epochs):
    perm = torch.randperm(n, generator=gen).to(x.device)
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


def _predict(model, x, chunk: int = 1000):
  import torch  # pylint: disable=g-import-not-at-top
  model.eval()
  with torch.no_grad():
    return torch.cat([torch.softmax(model(x[i:i + chunk]), 1)
                      for i in range(0, x.shape[0], chunk)])


def _torch_setup(cfg, threads: int):
  """What every PyTorch side starts from: (device, its synchronisation, a seeded generator,
  the spec, the built experiment whose data it uses, and ``images``: a numpy image array as an
  NCHW float32 tensor on the device, uint8 scaled to [0, 1])."""
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  dev = torch.device('cuda' if torch.cuda.is_available() else 'cpu')
  sync = torch.cuda.synchronize if dev.type == 'cuda' else (lambda: None)
  torch.manual_seed(0)
  gen = torch.Generator().manual_seed(0)
  spec, exp, _ = build(cfg)

  def images(a):
    a = np.asarray(a)
    a = a.astype(np.float32) / 255.0 if a.dtype == np.uint8 else a.astype(np.float32)
    if a.ndim == 3:
      a = a[..., None]
    return torch.from_numpy(np.ascontiguousarray(np.moveaxis(a, -1, 1))).to(dev)

  return dev, sync, gen, spec, exp, images


def _sharpen(mean, beta, temperature):
  """The server's soft labels: SCARLET's Enhanced ERA (``mean ** beta``, renormalised) where
  the algorithm has a ``beta``, else DS-FL's ERA (``softmax(mean / T)``)."""
  import torch  # pylint: disable=g-import-not-at-top
  if beta is not None:
    return torch.softmax(beta * torch.log(mean), 1)
  return torch.softmax(mean / temperature, 1)


def _timing(times: Sequence[float], dev, **extra) -> dict[str, Any]:
  """A PyTorch side's result: its warm-up round apart, the mean of the timed ones."""
  import torch  # pylint: disable=g-import-not-at-top
  return {'first_round_s': times[0], 'round_times_s': list(times[1:]),
          'round_s': float(np.mean(times[1:])), 'torch': torch.__version__,
          'threads': torch.get_num_threads(), 'device': str(dev), **extra}


def time_torch(cfg, rounds: int, threads: int) -> dict[str, Any]:
  """Round times of the PyTorch loop on the data and step counts of ``cfg``.

  It runs on the GPU when PyTorch sees one (data and models live there; each round ends with
  a synchronisation), else on the CPU with ``threads`` threads (0: PyTorch's default).
  """
  import torch  # pylint: disable=g-import-not-at-top
  dev, sync, gen, spec, exp, images = _torch_setup(cfg, threads)
  d = exp.ctx.data

  xp = images(d.x_private)
  yp = torch.from_numpy(np.asarray(d.y_private).astype(np.int64)).to(dev)
  idx, n = np.asarray(d.client_idx), np.asarray(d.client_n)
  rows = [torch.from_numpy(idx[k, :n[k]].astype(np.int64)).to(dev) for k in range(len(n))]
  data = [(xp[r], yp[r]) for r in rows]
  c, ch = d.num_classes, xp.shape[1]
  model_name = spec.clients.models[0]
  tr = spec.train
  times = []
  if spec.algorithm == 'fedavg':
    glob = torch_model(model_name, c, ch).to(dev)
    local = torch_model(model_name, c, ch).to(dev)
    weights = torch.tensor(n / n.sum(), dtype=torch.float32, device=dev)
    for _ in range(rounds + 1):
      t0 = time.perf_counter()
      start = {k: v.clone() for k, v in glob.state_dict().items()}
      acc = None
      for k, (x, y) in enumerate(data):
        local.load_state_dict(start)
        _fit(local, x, y, tr.epochs, tr.batch_size, tr.learning_rate, gen, soft=False)
        sd = local.state_dict()
        if acc is None:
          acc = {name: v.float() * weights[k] for name, v in sd.items()}
        else:
          for name, v in sd.items():
            acc[name] += v.float() * weights[k]
      glob.load_state_dict({name: v.to(start[name].dtype) for name, v in acc.items()})
      sync()
      times.append(time.perf_counter() - t0)
  else:   # public-set distillation: DS-FL / SCARLET (ERA or Enhanced ERA)
    x_pub = images(d.x_public)
    clients = [torch_model(model_name, c, ch).to(dev) for _ in range(len(n))]
    server = torch_model(spec.server.model, c, ch).to(dev) if spec.server.model else None
    de, db, dlr = spec.distill.epochs, spec.distill.batch_size, (spec.distill.optimizer or tr).learning_rate
    beta = getattr(spec.options, 'beta', None)   # SCARLET's Enhanced ERA, else ERA's T
    temperature = getattr(spec.options, 'temperature', 1.0)
    for t in range(1, rounds + 2):
      t0 = time.perf_counter()
      for m, (x, y) in zip(clients, data):
        _fit(m, x, y, tr.epochs, tr.batch_size, tr.learning_rate, gen, soft=False)
      draw = torch.from_numpy(np.asarray(exp.algorithm.sample_public(t)[0]).astype(np.int64)
                              ).to(dev)
      x_or = x_pub[draw]
      probs = torch.stack([_predict(m, x_or) for m in clients])
      mean = probs.mean(0)
      labels = _sharpen(mean, beta, temperature)
      for m in clients:
        _fit(m, x_or, labels, de, db, dlr, gen, soft=True)
      if server is not None:
        _fit(server, x_or, labels, de, db, dlr, gen, soft=True)
      sync()
      times.append(time.perf_counter() - t0)
  return _timing(times, dev)


def _vmap_parts(model_name: str, k: int, c: int, ch: int, dev):
  """K stacked client models for ``torch.func``: (a parameter-less base on ``meta``, the
  stacked parameters, the stacked buffers).

  BatchNorm goes through :func:`torch.func.replace_all_batch_norm_modules_`, PyTorch's
  documented way to vmap training through it: the layers normalise by batch statistics and
  keep no running statistics (their update is an in-place write that vmap refuses). The work of
  a step is the same but for that small elementwise update.
  """
  import copy  # pylint: disable=g-import-not-at-top
  from torch.func import replace_all_batch_norm_modules_, stack_module_state  # pylint: disable=g-import-not-at-top
  models = [replace_all_batch_norm_modules_(torch_model(model_name, c, ch)).to(dev)
            for _ in range(k)]
  params, buffers = stack_module_state(models)
  base = copy.deepcopy(models[0]).to('meta')
  # torch.func.grad differentiates by itself: plain tensors, so no autograd graph is recorded.
  return (base, {n: v.detach() for n, v in params.items()},
          {n: v.detach() for n, v in buffers.items()})


def _vmap_fns(base, lr: float, distill_lr: float, compiled: bool):
  """The per-step programs of the vmapped side: (train step, distill step, predict), SGD at
  ``lr`` on the private data and at ``distill_lr`` on the soft targets.

  A step takes the stacked parameters and each client's minibatch and returns the new
  parameters: ``vmap(grad(loss))`` over the client axis, then one SGD update per tensor. With
  ``compiled``, each is :func:`torch.compile`'d (TF32 allowed where the GPU has it, as XLA uses
  it by default).
  """
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top
  from torch.func import functional_call, grad, vmap  # pylint: disable=g-import-not-at-top

  def hard_loss(p, b, x, y):
    return F.cross_entropy(functional_call(base, (p, b), (x,)), y)

  def soft_loss(p, b, x, t):
    return -(t * F.log_softmax(functional_call(base, (p, b), (x,)), -1)).sum(-1).mean()

  hard_grad, soft_grad = vmap(grad(hard_loss)), vmap(grad(soft_loss))

  def train_step(p, b, x, y):
    g = hard_grad(p, b, x, y)
    return {n: v - lr * g[n] for n, v in p.items()}

  def distill_step(p, b, x, t):
    g = soft_grad(p, b, x, t)
    return {n: v - distill_lr * g[n] for n, v in p.items()}

  def predict(p, b, x):
    return torch.softmax(vmap(lambda pp, bb: functional_call(base, (pp, bb), (x,)))(p, b), -1)

  if compiled:
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    train_step, distill_step, predict = (torch.compile(f) for f in
                                         (train_step, distill_step, predict))
  return train_step, distill_step, predict


def time_torch_vmap(cfg, rounds: int, threads: int, compiled: bool = False) -> dict[str, Any]:
  """Round times of PyTorch with the clients batched, as a strong PyTorch engineer writes it:
  every client's parameters stacked (``torch.func.stack_module_state``), one
  ``vmap(grad(functional_call))`` step for all clients at once, each client with its own
  permutation of its data (and of the open samples) every epoch; with ``compiled``, the steps
  ``torch.compile``'d. Same data, models, step counts and aggregation as :func:`time_torch`.

  The stacked clients need equal data sizes (every workload here partitions into equal
  shards); a client with more rows than the smallest would be cut to it, and the row says how
  many rows were dropped.
  """
  import torch  # pylint: disable=g-import-not-at-top
  dev, sync, gen, spec, exp, images = _torch_setup(cfg, threads)
  d = exp.ctx.data

  idx, n = np.asarray(d.client_idx), np.asarray(d.client_n)
  k, m = len(n), int(n.min())
  rows = np.stack([idx[i, :m] for i in range(k)])                  # [K, m]
  xp = images(d.x_private)
  yp = torch.from_numpy(np.asarray(d.y_private).astype(np.int64)).to(dev)
  xs = xp[torch.from_numpy(rows).to(dev)]                            # [K, m, C, H, W]
  ys = yp[torch.from_numpy(rows).to(dev)]                            # [K, m]
  c, ch = d.num_classes, xp.shape[1]
  model_name = spec.clients.models[0]
  tr = spec.train
  lanes = torch.arange(k, device=dev)[:, None]

  def epochs_of(p, b, step, x, t, epochs, batch, shared):
    """``epochs`` passes, each client in its own order; ``x``/``t`` each client's own
    ([K, N, ...]), or with ``shared`` the same rows for all ([N, ...])."""
    size = x.shape[0] if shared else x.shape[1]
    for _ in range(epochs):
      perm = torch.stack([torch.randperm(size, generator=gen) for _ in range(k)]).to(dev)
      for i in range(0, size, batch):
        j = perm[:, i:i + batch]                                   # [K, B]
        p = step(p, b, *((x[j], t[j]) if shared else (x[lanes, j], t[lanes, j])))
    return p

  times = []
  base, params, buffers = _vmap_parts(model_name, k, c, ch, dev)
  dlr = (spec.distill.optimizer or tr).learning_rate if spec.algorithm != 'fedavg' else 0.0
  train_step, distill_step, predict = _vmap_fns(base, tr.learning_rate, dlr, compiled)
  if spec.algorithm == 'fedavg':
    weights = torch.tensor(n / n.sum(), dtype=torch.float32, device=dev)
    glob = {name: v[0].clone() for name, v in params.items()}
    for _ in range(rounds + 1):
      t0 = time.perf_counter()
      p = {name: v.expand(k, *v.shape).clone() for name, v in glob.items()}
      p = epochs_of(p, buffers, train_step, xs, ys, tr.epochs, tr.batch_size, False)
      glob = {name: torch.tensordot(weights, v, dims=1) for name, v in p.items()}
      sync()
      times.append(time.perf_counter() - t0)
  else:   # public-set distillation: DS-FL / SCARLET (ERA or Enhanced ERA)
    x_pub = images(d.x_public)
    server = torch_model(spec.server.model, c, ch).to(dev) if spec.server.model else None
    de, db = spec.distill.epochs, spec.distill.batch_size
    beta = getattr(spec.options, 'beta', None)
    temperature = getattr(spec.options, 'temperature', 1.0)
    p = params
    for t in range(1, rounds + 2):
      t0 = time.perf_counter()
      p = epochs_of(p, buffers, train_step, xs, ys, tr.epochs, tr.batch_size, False)
      draw = torch.from_numpy(np.asarray(exp.algorithm.sample_public(t)[0]).astype(np.int64)
                              ).to(dev)
      x_or = x_pub[draw]
      probs = torch.cat([predict(p, buffers, x_or[i:i + 1000])
                         for i in range(0, x_or.shape[0], 1000)], 1)     # [K, |o_r|, C]
      mean = probs.mean(0)
      labels = _sharpen(mean, beta, temperature)
      p = epochs_of(p, buffers, distill_step, x_or, labels, de, db, True)
      if server is not None:
        _fit(server, x_or, labels, de, db, dlr, gen, soft=True)
      sync()
      times.append(time.perf_counter() - t0)
  return _timing(times, dev, compiled=compiled, rows_dropped=int(n.sum() - k * m))


# ------------------------------------------------------------ driver
# The PyTorch sides, each with the word its log lines carry: a loop over clients (the peer
# code bases), clients batched with torch.func.vmap (eager), and the same torch.compile'd.
SIDE_WORDS = {'loop': 'pytorch', 'vmap': 'pytorch vmap', 'vmap_compiled': 'pytorch vmap+compile'}
TORCH_SIDES = tuple(SIDE_WORDS)


def run(workloads: Sequence[str], repeats: int, rounds: int, threads: int, args,
        log=print, torch_side: bool = True, torch_sides: Sequence[str] = ('loop', 'vmap')
        ) -> list[dict[str, Any]]:
  """Runs every workload ``repeats`` times on each side; returns one row per workload.

  The sides run in turn within each repeat (fedjax_kd, then each of ``torch_sides``), so
  that all see the same machine state. With ``torch_side=False`` only fedjax_kd runs (the
  PyTorch columns are None).
  """
  torch_sides = tuple(torch_sides) if torch_side else ()
  import jax  # pylint: disable=g-import-not-at-top
  rows = []
  peak = peak_gflops(threads=threads)
  log('peak float32 matmul: ' + ', '.join(f'{k} {v:.1f} GFLOP/s' for k, v in peak.items()))
  with tempfile.TemporaryDirectory() as tmp:
    for name, make in cases(workloads, args):
      cfg, desc = make(tmp)
      jx = []
      sides: dict[str, list[dict[str, Any]]] = {side: [] for side in torch_sides}
      for rep in range(repeats):
        jx.append(time_fedjax(cfg, rounds, count_flops=not jx))
        log(f'{name} K={cfg.clients.num_clients} {cfg.clients.models[0]} run {rep + 1}: '
            f'fedjax_kd {jx[-1]["round_s"]:.2f} s/round '
            f'(first {jx[-1]["first_round_s"]:.1f} s)')
        for side in torch_sides:
          if side == 'loop':
            sides[side].append(time_torch(cfg, rounds, threads))
          else:
            sides[side].append(time_torch_vmap(cfg, rounds, threads,
                                               compiled=side == 'vmap_compiled'))
          log(f'{name} K={cfg.clients.num_clients} {cfg.clients.models[0]} run {rep + 1}: '
              f'{SIDE_WORDS[side]} {sides[side][-1]["round_s"]:.2f} s/round '
              f'(first {sides[side][-1]["first_round_s"]:.1f} s)')
      j = float(np.median([r['round_s'] for r in jx]))
      med = {side: float(np.median([r['round_s'] for r in runs])) if runs else None
             for side, runs in sides.items()}
      pt = sides.get('loop', [])
      p = med.get('loop')
      flop, moved = jx[0]['round_flop'], jx[0]['round_bytes']
      rows.append({'workload': name, 'data': desc, 'clients': int(cfg.clients.num_clients),
                   'model': list(cfg.clients.models)[0], 'algorithm': cfg.algorithm,
                   'batch_size': int(cfg.train.batch_size), 'epochs': int(cfg.train.epochs),
                   'repeats': repeats, 'timed_rounds': rounds, 'fedjax_round_s': j,
                   'torch_round_s': p, 'ratio': p / j if p else None,
                   'round_gflop': flop / 1e9, 'fedjax_gflops': flop / j / 1e9,
                   'round_gbytes': moved / 1e9, 'fedjax_gbytes_s': moved / j / 1e9,
                   'torch_gflops': flop / p / 1e9 if p else None,
                   'peak_gflops_xla': peak['xla'], 'peak_gflops_torch': peak.get('torch'),
                   'fedjax_first_round_s': float(np.median(
                       [r['first_round_s'] for r in jx])),
                   'fedjax_runs': jx, 'torch_runs': pt,
                   **{f'torch_{side}_round_s': med.get(side) for side in TORCH_SIDES[1:]},
                   **{f'torch_{side}_ratio': med[side] / j if med.get(side) else None
                      for side in TORCH_SIDES[1:]},
                   **{f'torch_{side}_runs': sides.get(side, []) for side in TORCH_SIDES[1:]},
                   'jax': jax.__version__, 'backend': jax.default_backend(),
                   'torch': next((r[0]['torch'] for r in sides.values() if r), None),
                   'torch_threads': pt[0]['threads'] if pt else None,
                   'torch_device': pt[0]['device'] if pt else None})
  return rows


def table(rows: Sequence[dict[str, Any]]) -> str:
  """A markdown table of the rows (median over repeats)."""
  out = ['| workload | clients | model | batch | fedjax_kd s/round | PyTorch loop s/round | '
         'speed-up | PyTorch vmap s/round (eager / compiled) | speed-up over vmap (eager / '
         'compiled) | GFLOP/round | fedjax_kd GFLOP/s | PyTorch GFLOP/s | matmul peak GFLOP/s '
         '(XLA / PyTorch) | fedjax_kd round 1 (compile) |',
         '|---|---|---|---|---|---|---|---|---|---|---|---|---|---|']
  num = lambda v, d=2: '-' if v is None else f'{v:.{d}f}'
  times = lambda v: '-' if v is None else f'{v:.2f}x'
  for r in rows:
    peak = f'{r["peak_gflops_xla"]:.0f} / {num(r["peak_gflops_torch"], 0)}'
    ratio = times(r['ratio'])
    vm = (f'{num(r.get("torch_vmap_round_s"))} / '
          f'{num(r.get("torch_vmap_compiled_round_s"))}')
    vr = (f'{times(r.get("torch_vmap_ratio"))} / '
          f'{times(r.get("torch_vmap_compiled_ratio"))}')
    out.append(f'| {r["workload"]} | {r["clients"]} | {r["model"]} | {r["batch_size"]} | '
               f'{r["fedjax_round_s"]:.2f} | {num(r["torch_round_s"])} | '
               f'{ratio} | {vm} | {vr} | '
               f'{r["round_gflop"]:.1f} | {r["fedjax_gflops"]:.1f} | '
               f'{num(r["torch_gflops"], 1)} | {peak} | {r["fedjax_first_round_s"]:.1f} s |')
  return '\n'.join(out)


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('--workload', default='all', help=f'one of {", ".join(WORKLOADS)} or all')
  p.add_argument('--repeats', type=int, default=3)
  p.add_argument('--rounds', type=int, default=1, help='timed rounds after the warm-up round')
  p.add_argument('--clients', type=int, default=0, help="0: the workload's CPU default")
  p.add_argument('--epochs', type=int, default=0, help="0: the workload's epochs")
  p.add_argument('--threads', type=int, default=0, help='torch threads (0: its default)')
  p.add_argument('--many_clients', default=','.join(map(str, MANY_CLIENTS)),
                 help='client counts of the many-clients workloads (comma-separated)')
  p.add_argument('--many_models', default=','.join(MANY_MODELS),
                 help='models of the many-clients workloads (comma-separated)')
  p.add_argument('--mnist', default=MNIST_DEFAULT,
                 help='MNIST .npz (Keras layout; default $FEDJAX_KD_MNIST)')
  p.add_argument('--torch_sides', default='loop,vmap',
                 help='PyTorch sides, comma-separated, of ' + ', '.join(TORCH_SIDES))
  p.add_argument('--out', default='', help='write the rows as JSON here')
  a = p.parse_args(argv)
  sides = tuple(v for v in a.torch_sides.split(',') if v)
  if not sides or any(v not in TORCH_SIDES for v in sides):
    print(f'error: --torch_sides={a.torch_sides!r}: comma-separated, of '
          f'{", ".join(TORCH_SIDES)}', file=sys.stderr)
    return 2
  names = WORKLOADS if a.workload == 'all' else tuple(a.workload.split(','))
  bad = [w for w in names if w not in WORKLOADS]
  if bad:
    print(f'error: --workload: {bad[0]!r}; allowed: {", ".join(WORKLOADS)}, all', file=sys.stderr)
    return 2
  for flag in ('repeats', 'rounds'):
    if getattr(a, flag) < 1:
      print(f'error: --{flag} must be >= 1', file=sys.stderr)
      return 2
  try:
    a.many_clients = tuple(int(v) for v in a.many_clients.split(','))
  except ValueError:
    a.many_clients = (0,)
  if any(k < 1 or k > MNIST_TRAIN // 2 for k in a.many_clients):
    print(f'error: --many_clients: {a.many_clients}: positive integers up to {MNIST_TRAIN // 2}',
          file=sys.stderr)
    return 2
  a.many_models = tuple(m for m in a.many_models.split(',') if m)
  unknown = [m for m in a.many_models if m not in MANY_MODELS]
  if unknown or not a.many_models:
    print(f'error: --many_models: {unknown[0] if unknown else "(none)"!r}; allowed: '
          f'{", ".join(MANY_MODELS)}', file=sys.stderr)
    return 2
  if importlib.util.find_spec('torch') is None:
    print('error: PyTorch is not installed (pip install -e .[bench]): it is a benchmark extra',
          file=sys.stderr)
    return 2
  rows = run(names, a.repeats, a.rounds, a.threads, a, torch_sides=sides)
  print(table(rows))
  if a.out:
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, 'w') as f:
      json.dump(rows, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
