"""The shared driver of the PyTorch references: the shared setting, models, loop and sweeps.

A reference run takes from fedjax_kd only what a pair of runs must share: for one config and
seed, ``fedjax_kd.running.experiment.build`` gives the open/private/test split, the client partition
and the per-round open-set draws (numpy code; nothing of fedjax_kd's training runs). All
else is PyTorch as the FD code bases write it: ``torch.nn`` modules with PyTorch's default
initialisation and BatchNorm, ``torch.optim.SGD``, a fresh ``torch.randperm`` of each data
set every epoch with the partial last batch kept, ``model.eval()`` wherever a model predicts.

Switches (:class:`RefOptions`), each one known difference between the two implementations,
so that a gap between the curves can be taken apart one difference at a time:

* ``reference.bn_running_var``: ``'unbiased'`` (PyTorch: the running variance averages the
  batch variance with Bessel's correction) or ``'biased'`` (Flax, and so fedjax_kd: without);
* ``reference.init``: ``'torch'`` (PyTorch's own draw) or ``'fedjax'`` (the initial weights
  fedjax_kd draws for the seed, converted to PyTorch's layout);
* ``reference.batches``: ``'torch'`` (``torch.randperm`` every epoch) or ``'fedjax'``
  (fedjax_kd's minibatch order of each client, round and phase);
* ``reference.seed_offset``: PyTorch's RNG seed is ``seed + offset`` (two references that
  differ only in their random draws: the seed-noise floor of a paired comparison).

With ``init='fedjax'``, ``batches='fedjax'`` and ``bn_running_var='biased'`` (lock-step) the
two implementations start from the same weights and see the same batches, so what is left
between them is float rounding: the curves agree until rounding differences grow.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from fedjax_kd import config as config_lib  # pylint: disable=g-import-not-at-top
from fedjax_kd import sweep  # pylint: disable=g-import-not-at-top
from fedjax_kd.errors import ConfigError, DataError  # pylint: disable=g-import-not-at-top
from fedjax_kd.running import workdir as workdir_lib  # pylint: disable=g-import-not-at-top

MNIST_DEFAULT = os.environ.get('FEDJAX_KD_MNIST', '')


# ------------------------------------------------------------ switches
@dataclasses.dataclass(frozen=True)
class RefOptions:
  """How the reference differs from PyTorch's defaults (see the module docstring)."""
  bn_running_var: str = 'unbiased'
  init: str = 'torch'
  batches: str = 'torch'
  seed_offset: int = 0

  @property
  def lockstep(self) -> bool:
    return self.init == 'fedjax' or self.batches == 'fedjax'


# The switches that put the reference in lock-step with fedjax_kd: its initial weights, its
# minibatch order and its biased BatchNorm running variance (only float rounding is left).
LOCKSTEP = {'reference.init': 'fedjax', 'reference.batches': 'fedjax',
            'reference.bn_running_var': 'biased'}

# field -> allowed values (a tuple) or a type
REFERENCE_FIELDS: dict[str, Any] = {
    'reference.bn_running_var': ('unbiased', 'biased'),
    'reference.init': ('torch', 'fedjax'),
    'reference.batches': ('torch', 'fedjax'),
    'reference.seed_offset': int,
}


def split_reference(fields: Any) -> tuple[RefOptions, tuple[tuple[str, Any], ...]]:
  """Takes the ``reference.*`` fields out of ``fields``; returns them as options and the rest.

  Raises:
    ConfigError: an unknown ``reference.*`` field or a value it does not allow.
  """
  opts, rest = {}, []
  for field, value in sweep.planning._pairs(fields):  # pylint: disable=protected-access
    if not field.startswith('reference.'):
      rest.append((field, value))
      continue
    allowed = REFERENCE_FIELDS.get(field)
    if allowed is None:
      raise ConfigError(field, value, 'one of ' + ', '.join(REFERENCE_FIELDS))
    if isinstance(allowed, tuple) and value not in allowed:
      raise ConfigError(field, value, allowed)
    if allowed is int and (isinstance(value, bool) or not isinstance(value, int)):
      raise ConfigError(field, value, 'an integer')
    opts[field.split('.', 1)[1]] = value
  return RefOptions(**opts), tuple(rest)


# ------------------------------------------------------------ the shared setting
@dataclasses.dataclass(frozen=True)
class Setting:
  """Everything a pair of runs shares, as host arrays (images NHWC, as fedjax_kd's models see
  them).

  Attributes:
    x_private, y_private: the pooled private data.
    client_rows: per client, its rows of ``x_private``.
    x_public, y_public: the open set (its labels only feed diagnostics).
    x_test, y_test: the server's test set.
    client_test_rows: per client, its personalised test split (rows of ``x_test``), or
      None when the config makes none.
    draws: ``[rounds, n]`` the open samples of each round.
    num_classes: number of classes.
    client_models: per client, its fedjax_kd model spec (``'cnn@0.5'``: name@width).
    server_model: the server model's spec.
    train: ``(epochs, batch_size, learning_rate)`` of private training.
    distill: ``(epochs, batch_size, learning_rate)`` of distillation.
    spec: fedjax_kd's validated spec (the algorithm's options are ``spec.options``).
    config: the fedjax_kd config, as a JSON-able dict.
    experiment: the built fedjax_kd experiment (lock-step runs read its initial weights
      and minibatch keys; nothing trains it).
  """
  x_private: np.ndarray
  y_private: np.ndarray
  client_rows: tuple[np.ndarray, ...]
  x_public: np.ndarray
  y_public: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  client_test_rows: tuple[np.ndarray, ...] | None
  draws: np.ndarray
  num_classes: int
  client_models: tuple[str, ...]
  server_model: str
  train: tuple[int, int, float]
  distill: tuple[int, int, float]
  spec: Any = dataclasses.field(repr=False)
  config: dict[str, Any] = dataclasses.field(repr=False)
  experiment: Any = dataclasses.field(repr=False, compare=False)


def export_setting(cfg, algorithms: Sequence[str]) -> Setting:
  """Builds fedjax_kd's experiment for ``cfg`` (no training) and takes its data and draws.

  Raises:
    ConfigError: ``cfg`` is not one of ``algorithms``, or its clients and server do not
      all run one model the reference has.
  """
  from fedjax_kd.running import experiment  # pylint: disable=g-import-not-at-top
  spec = config_lib.validate(cfg)
  if spec.algorithm not in algorithms:
    raise ConfigError('algorithm', spec.algorithm, tuple(algorithms))
  for field, names in (('clients.models', list(spec.clients.models)),
                       ('server.model', [spec.server.model])):
    if not {_parse_model(m)[0] for m in names} <= set(MODELS):
      raise ConfigError(field, names, f'models the reference has: {tuple(MODELS)}')
  exp = experiment.build(spec)
  d = exp.ctx.data
  idx, n = np.asarray(d.client_idx), np.asarray(d.client_n)
  tr, di = spec.train, spec.distill.optimizer or spec.train
  if exp.algorithm.uses_public and d.x_public.shape[0]:
    draws = np.stack([exp.algorithm.sample_public(t)[0] for t in range(1, spec.rounds + 1)])
  else:   # parameter exchange: no open set
    draws = np.zeros((spec.rounds, 0), np.int64)
  return Setting(
      x_private=d.normalize.host(np.asarray(d.x_private)), y_private=np.asarray(d.y_private),
      client_rows=tuple(idx[k, :n[k]] for k in range(len(n))),
      x_public=d.normalize.host(np.asarray(d.x_public)),
      y_public=np.asarray(d.y_public if d.y_public is not None else np.zeros(0, np.int64)),
      x_test=d.normalize.host(np.asarray(d.x_test)), y_test=np.asarray(d.y_test),
      client_test_rows=None if d.test_idx is None else tuple(
          np.asarray(d.test_idx)[k, :int(d.test_n[k])] for k in range(len(d.test_n))),
      draws=draws,
      num_classes=d.num_classes, client_models=tuple(spec.clients.models),
      server_model=spec.server.model,
      train=(tr.epochs, tr.batch_size, tr.learning_rate),
      distill=(spec.distill.epochs, spec.distill.batch_size, di.learning_rate),
      spec=spec, config=json.loads(cfg.to_json_best_effort()), experiment=exp)


# ------------------------------------------------------------ models
def _batchnorm_classes():
  """BatchNorm1d/2d whose running variance may average the biased batch variance."""
  import torch  # pylint: disable=g-import-not-at-top
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  import torch.nn.functional as F  # pylint: disable=g-import-not-at-top

  class Biased:
    """Train mode: batch statistics as usual; the running variance takes the variance
    without Bessel's correction (Flax's rule) instead of PyTorch's unbiased one."""
    biased = False

    def forward(self, x):  # pylint: disable=missing-function-docstring
      if not (self.training and self.biased):
        return super().forward(x)
      dims = [0] + list(range(2, x.dim()))
      with torch.no_grad():
        m = self.momentum
        self.running_mean.mul_(1 - m).add_(x.mean(dims), alpha=m)
        self.running_var.mul_(1 - m).add_(x.var(dims, unbiased=False), alpha=m)
      return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

  class BN1d(Biased, nn.BatchNorm1d):
    pass

  class BN2d(Biased, nn.BatchNorm2d):
    pass

  return BN1d, BN2d


def _mark_bn(layers: list, biased_bn: bool):
  for m in layers:
    if hasattr(m, 'biased'):
      m.biased = biased_bn
  return layers


def dsfl_cnn(num_classes: int, in_channels: int = 1, biased_bn: bool = False):
  """DS-FL's MNIST CNN (583,242 trainable parameters) with PyTorch's defaults.

  Conv5x5(32) VALID -> BN -> ReLU -> MaxPool2 -> Conv5x5(64) VALID -> BN -> ReLU -> MaxPool2
  -> Dense(512) -> BN -> ReLU -> Dense(C). BatchNorm momentum 0.1, epsilon 1e-5 (PyTorch's
  defaults; fedjax_kd's ``dsfl_cnn`` uses the same).
  """
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  bn1d, bn2d = _batchnorm_classes()
  return nn.Sequential(*_mark_bn(
      [nn.Conv2d(in_channels, 32, 5), bn2d(32), nn.ReLU(), nn.MaxPool2d(2),
       nn.Conv2d(32, 64, 5), bn2d(64), nn.ReLU(), nn.MaxPool2d(2),
       nn.Flatten(), nn.Linear(4 * 4 * 64, 512), bn1d(512), nn.ReLU(),
       nn.Linear(512, num_classes)], biased_bn))


def lenet5(num_classes: int, in_channels: int = 1, biased_bn: bool = False):
  """LeNet-5 as NIID-Bench runs it on 28x28 images, with PyTorch's defaults.

  Conv5x5(6) VALID -> ReLU -> MaxPool2 -> Conv5x5(16) VALID -> ReLU -> MaxPool2 ->
  Dense(120) -> ReLU -> Dense(84) -> ReLU -> Dense(C) (no BatchNorm).
  """
  del biased_bn
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  return nn.Sequential(
      nn.Conv2d(in_channels, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(16 * 4 * 4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
      nn.Linear(84, num_classes))


def from_flax(model, params: dict, stats: dict) -> dict:
  """A state dict for the PyTorch ``model`` from fedjax_kd's variables of the same model.

  The layers are matched in order (the i-th ``nn.Conv2d`` is ``Conv_i``, the i-th
  ``nn.Linear`` is ``Dense_i``, the i-th BatchNorm is ``BatchNorm_i``). Conv kernels go from
  ``[kh, kw, Cin, Cout]`` to ``[Cout, Cin, kh, kw]``, Dense kernels are transposed, and the
  first Dense layer after the convolutions has its inputs reordered from NHWC flattening
  (fedjax_kd) to NCHW flattening (``nn.Flatten`` after a PyTorch convolution).
  """
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  a = lambda x: np.asarray(x, np.float32)
  sd, count, channels, flat = {}, {'Conv': 0, 'Dense': 0, 'BatchNorm': 0}, None, False
  for name, m in model.named_modules():
    if isinstance(m, nn.Conv2d):
      p = params[f'Conv_{count["Conv"]}']
      count['Conv'] += 1
      sd[f'{name}.weight'] = a(p['kernel']).transpose(3, 2, 0, 1)
      sd[f'{name}.bias'] = a(p['bias'])
      channels = m.out_channels
    elif isinstance(m, nn.Flatten):
      flat = channels is not None
    elif isinstance(m, nn.Linear):
      p = params[f'Dense_{count["Dense"]}']
      count['Dense'] += 1
      k = a(p['kernel'])
      if flat:   # NHWC -> NCHW order of the flattened inputs (square feature maps)
        hw = int(round((k.shape[0] // channels) ** 0.5))
        k = k.reshape(hw, hw, channels, -1).transpose(2, 0, 1, 3).reshape(k.shape[0], -1)
        flat = False
      sd[f'{name}.weight'] = k.T
      sd[f'{name}.bias'] = a(p['bias'])
    elif isinstance(m, nn.modules.batchnorm._BatchNorm):  # pylint: disable=protected-access
      key = f'BatchNorm_{count["BatchNorm"]}'
      count['BatchNorm'] += 1
      sd[f'{name}.weight'] = a(params[key]['scale'])
      sd[f'{name}.bias'] = a(params[key]['bias'])
      sd[f'{name}.running_mean'] = a(stats[key]['mean'])
      sd[f'{name}.running_var'] = a(stats[key]['var'])
  return sd


def cnn(num_classes: int, in_channels: int = 1, biased_bn: bool = False, width: float = 1.0,
        hw: int = 28):
  """The small CNN of McMahan et al. (AISTATS 2017) at a width multiplier, as fedjax_kd's
  ``cnn``: Conv5x5(16w) SAME -> ReLU -> MaxPool2 -> Conv5x5(32w) SAME -> ReLU -> MaxPool2 ->
  Dense(128w) -> ReLU -> Dense(C) (no BatchNorm; hidden sizes ``round(n * w)``)."""
  del biased_bn
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  c1, c2, h = (_scaled(n, width) for n in (16, 32, 128))
  side = hw // 4
  return nn.Sequential(
      nn.Conv2d(in_channels, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
      nn.Flatten(), nn.Linear(c2 * side * side, h), nn.ReLU(), nn.Linear(h, num_classes))


def mlp(num_classes: int, in_channels: int = 1, biased_bn: bool = False, width: float = 1.0,
        hw: int = 28):
  """McMahan et al.'s 2NN at a width multiplier, as fedjax_kd's ``mlp``: Flatten ->
  Dense(200w) -> ReLU -> Dense(200w) -> ReLU -> Dense(C)."""
  del biased_bn
  import torch.nn as nn  # pylint: disable=g-import-not-at-top
  h = _scaled(200, width)
  return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * hw * hw, h), nn.ReLU(),
                       nn.Linear(h, h), nn.ReLU(), nn.Linear(h, num_classes))


def _scaled(n: int, width: float) -> int:
  return max(1, int(np.floor(n * width + 0.5)))


def _parse_model(spec: str) -> tuple[str, float]:
  """``'cnn@0.5'`` -> ``('cnn', 0.5)``; a bare name has width 1."""
  name, _, width = spec.partition('@')
  return name, float(width) if width else 1.0


# fedjax_kd model name -> PyTorch builder (the width-scaled ones take ``width`` and ``hw``)
MODELS: dict[str, Callable] = {'dsfl_cnn': dsfl_cnn, 'lenet5': lenet5, 'cnn': cnn, 'mlp': mlp}
_WIDTH_MODELS = ('cnn', 'mlp')


def nchw(a: np.ndarray):
  import torch  # pylint: disable=g-import-not-at-top
  return torch.from_numpy(np.array(np.moveaxis(a, -1, 1), np.float32))


# ------------------------------------------------------------ fedjax_kd's draws (lock-step)
@functools.cache
def _epoch_positions():
  """fedjax_kd's minibatch order, compiled once per shape (eager it takes seconds a call)."""
  import jax  # pylint: disable=g-import-not-at-top
  from fedjax_kd.core import program  # pylint: disable=g-import-not-at-top
  return jax.jit(program.epoch_positions, static_argnums=(1, 3, 4))


class Lockstep:
  """fedjax_kd's initial weights and minibatch order for the setting's experiment."""

  def __init__(self, setting: Setting):
    import jax  # pylint: disable=g-import-not-at-top
    self._jax = jax
    self.exp = setting.experiment
    self.root = self.exp.ctx.root
    self._state = None
    # fedjax_kd's order of a client's real samples does not depend on how far the client is
    # padded (program.epoch_positions), so one padded length serves every client: one compile
    # instead of one per client size.
    self.pad_to = max((len(r) for r in setting.client_rows), default=0)

  def _initial(self):
    if self._state is None:
      self._state = self.exp.algorithm.init()
    return self._state

  def client_variables(self, k: int) -> tuple[dict, dict]:
    """Client ``k``'s initial ``(params, batch_stats)`` as numpy trees."""
    st = self._initial()
    fed = self.exp.ctx.fed
    cohort = int(fed._cohort_of[k])  # pylint: disable=protected-access
    row = int(fed._row_of[k])  # pylint: disable=protected-access
    state = st.clients[cohort]
    take = lambda tree: self._jax.tree.map(lambda x: np.asarray(x[row]), tree)
    return take(state.params), take(state.batch_stats or {})

  def server_variables(self) -> tuple[dict, dict]:
    """The server model's initial ``(params, batch_stats)`` as numpy trees."""
    st = self._initial()
    take = lambda tree: self._jax.tree.map(lambda x: np.asarray(x[0]), tree)
    return take(st.server.params), take(st.server.batch_stats or {})

  def order(self, t: int, who: int | None, phase: str, n_max: int, n: int, epochs: int,
            batch_size: int) -> np.ndarray:
    """``[steps, batch_size]`` positions fedjax_kd visits (``>= n``: no sample).

    ``who``: a client id, or None for the server model.
    """
    from fedjax_kd.core import rng  # pylint: disable=g-import-not-at-top
    if who is None:
      key = rng.server_key(self.root, t, phase)
    else:
      key = rng.client_keys(self.root, t, np.array([who]), phase)[0]
    pos, _ = _epoch_positions()(key, max(n_max, self.pad_to), self._jax.numpy.int32(n),
                                epochs, batch_size)
    return np.asarray(pos)


# ------------------------------------------------------------ the training loop
class Context:
  """What an algorithm module's rounds use: the setting, the switches and the loop pieces.

  Attributes:
    setting: the shared :class:`Setting`.
    options: the :class:`RefOptions` of this run.
    seed: the run's seed.
    gen: the ``torch.Generator`` of the shuffles.
  """

  def __init__(self, setting: Setting, options: RefOptions, seed: int):
    import torch  # pylint: disable=g-import-not-at-top
    self.torch = torch
    self.setting, self.options, self.seed = setting, options, seed
    torch.manual_seed(seed + options.seed_offset)
    self.gen = torch.Generator().manual_seed(seed + options.seed_offset)
    self.lockstep = Lockstep(setting) if options.lockstep else None
    s = setting
    self.xp = nchw(s.x_private)
    self.yp = torch.from_numpy(s.y_private.astype(np.int64))
    self.x_pub, self.x_test = nchw(s.x_public), nchw(s.x_test)
    self.y_pub = torch.from_numpy(s.y_public.astype(np.int64))
    self.y_test = torch.from_numpy(s.y_test.astype(np.int64))
    self.shape = tuple(s.x_private.shape[1:])
    self.data = [(self.xp[self._rows(r)], self.yp[self._rows(r)]) for r in s.client_rows]

  def _rows(self, rows: np.ndarray):
    return self.torch.from_numpy(np.asarray(rows, np.int64))

  @property
  def num_clients(self) -> int:
    return len(self.setting.client_rows)

  def model(self, client: int | None):
    """A new model for client ``client`` (None: the server), initialised as the switch says."""
    s = self.setting
    name, width = _parse_model(s.server_model if client is None else s.client_models[client])
    kw = {'width': width, 'hw': self.xp.shape[2]} if name in _WIDTH_MODELS else {}
    if name not in _WIDTH_MODELS and width != 1.0:
      raise ValueError(f'the reference runs {name} at width 1 only, got {width}')
    m = MODELS[name](s.num_classes, self.xp.shape[1],
                     biased_bn=self.options.bn_running_var == 'biased', **kw)
    if self.options.init == 'fedjax':
      variables = (self.lockstep.server_variables() if client is None
                   else self.lockstep.client_variables(client))
      sd = from_flax(m, *variables)
      missing = set(m.state_dict()) - set(sd)
      if any(not k.endswith('num_batches_tracked') for k in missing):
        raise ValueError(f'fedjax_kd weights lack {sorted(missing)[:3]} of the PyTorch model')
      m.load_state_dict({k: self.torch.tensor(np.array(v, np.float32))
                         for k, v in sd.items()}, strict=False)
    return m

  def fit(self, model, x, targets, rule: tuple[int, int, float], soft: bool, *, t: int,
          who: int | None, phase: str, momentum: float = 0.0, weight_decay: float = 0.0,
          penalty: Callable | None = None, after_step: Callable | None = None) -> float:
    """Minibatch SGD over ``(x, targets)``; returns the mean batch loss.

    ``rule``: ``(epochs, batch_size, learning_rate)``. PyTorch order: a new permutation
    every epoch, the partial last batch kept (a DataLoader with ``shuffle=True``); with
    ``batches='fedjax'``, fedjax_kd's order for ``(t, who, phase)``. A new
    ``torch.optim.SGD`` (``momentum``, coupled ``weight_decay``) every call. ``penalty()``
    is added to every batch loss (FedProx); ``after_step()`` runs after every
    ``optimizer.step()`` (SCAFFOLD's correction). ``self.steps_run`` is the number of steps.
    """
    torch, F = self.torch, self.torch.nn.functional
    epochs, batch_size, lr = rule
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    n = x.shape[0]
    if self.options.batches == 'fedjax':
      pos = self.lockstep.order(t, who, phase, n, n, epochs, batch_size)
      steps = [torch.from_numpy(p[p < n].astype(np.int64)) for p in pos]
    else:
      steps = []
      for _ in range(epochs):
        perm = torch.randperm(n, generator=self.gen)
        steps += [perm[i:i + batch_size] for i in range(0, n, batch_size)]
    losses = []
    for j in steps:
      if not len(j):
        continue
      logits = model(x[j])
      if soft:
        loss = -(targets[j] * F.log_softmax(logits, 1)).sum(1).mean()
      else:
        loss = F.cross_entropy(logits, targets[j])
      losses.append(loss.item())
      if penalty is not None:
        loss = loss + penalty()
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      if after_step is not None:
        after_step()
    self.steps_run = len(losses)
    return float(np.mean(losses)) if losses else float('nan')

  def predict(self, model, x, chunk: int = 1000):
    """Softmax probabilities in inference mode (``model.eval()``)."""
    torch = self.torch
    model.eval()
    with torch.no_grad():
      return torch.cat([torch.softmax(model(x[i:i + chunk]), 1)
                        for i in range(0, x.shape[0], chunk)])

  def test_acc(self, model) -> float:
    return float((self.predict(model, self.x_test).argmax(1) == self.y_test).float().mean())

  def client_test_acc(self, model, k: int) -> float:
    """``model``'s accuracy on client ``k``'s personalised test split (inference mode)."""
    rows = self.setting.client_test_rows
    if rows is None:
      raise ValueError('the config makes no per-client test splits')
    j = self._rows(rows[k])
    return float((self.predict(model, self.x_test[j]).argmax(1) == self.y_test[j]).float().mean())

  def mean_client_acc(self, models) -> float:
    """UA: the mean over clients of each client model's personalised test accuracy."""
    return float(np.mean([self.client_test_acc(m, k) for k, m in enumerate(models)]))


def run(module, setting: Setting, options: RefOptions, seed: int, workdir: str,
        threads: int = 0, log=print) -> dict[str, Any]:
  """Runs ``module``'s rounds on ``setting``; writes the workdir; returns the summary.

  The workdir is locked for the whole run (:class:`fedjax_kd.running.workdir.DirLock`, as
  fedjax_kd's runs are): a second process given the same run is refused instead of interleaving its
  rows with the first one's.

  Raises:
    DataError: another live process is running in ``workdir``.
  """
  with workdir_lib.DirLock(workdir, 'workdir'):
    return _run_locked(module, setting, options, seed, workdir, threads, log)


def _run_locked(module, setting: Setting, options: RefOptions, seed: int, workdir: str,
                threads: int, log) -> dict[str, Any]:
  import torch  # pylint: disable=g-import-not-at-top
  if threads:
    torch.set_num_threads(threads)
  ctx = Context(setting, options, seed)
  writer = workdir_lib.MetricsWriter(workdir)   # an unfinished earlier call's rows go
  workdir_lib.write_json(os.path.join(workdir, 'config.json'),
                         {**setting.config, 'reference': dataclasses.asdict(options),
                          'engine': f'benchmarks/references/pytorch/{module.__name__.split(".")[-1]}.py'},
                         indent=2)
  rows, t0, start = [], time.time(), time.time()
  name = f'{os.path.basename(os.path.dirname(workdir))}/{os.path.basename(workdir)}'
  for row in module.rounds(ctx):
    bad = row.pop('nonfinite', None)
    if bad:   # as fedjax_kd's runner: the round is not recorded, the run stops
      workdir_lib.write_json(os.path.join(workdir, sweep.DIVERGED_FILE),
                             {'round': row['round'], 'message': bad}, indent=2)
      log(f'{name} round {row["round"]}: diverged ({bad})')
      return {'rounds': len(rows), 'diverged': row['round'], 'seed': seed}
    row['round_time_s'] = time.time() - start
    rows.append(writer.write(row))
    log(f'{name} round {row["round"]}: acc {row["test_acc"]:.4f} '
        + ' '.join(f'{k} {row[k]:.3f}' for k in module.METRICS if k in row)
        + f' ({row["round_time_s"]:.1f} s)')
    start = time.time()
  summary = {'rounds': len(rows), 'final_acc': rows[-1]['test_acc'],
             'best_acc': max(r['test_acc'] for r in rows), 'wall_time_s': time.time() - t0,
             'seed': seed, 'reference': dataclasses.asdict(options),
             'torch': torch.__version__, 'threads': torch.get_num_threads()}
  workdir_lib.write_json(os.path.join(workdir, 'summary.json'), summary, indent=2)
  return summary


# ------------------------------------------------------------ sweeps
def without_reference(cfg):
  """``cfg`` without any ``reference`` group (the switches never reach fedjax_kd)."""
  if 'reference' in cfg:
    cfg = cfg.copy_and_resolve_references()
    with cfg.unlocked():
      del cfg['reference']
  return cfg


def plan(base, variants: Sequence[sweep.Variant], seeds: Sequence[int], out: str,
         overrides: Any = (), grid: dict[str, Sequence[Any]] | None = None
         ) -> list[sweep.Run]:
  """Every (variant, grid cell, seed) run, laid out as :func:`fedjax_kd.sweep.plan` does.

  A variant's ``reference.*`` fields are the reference's switches; its other fields, the
  grid cell, then ``overrides`` are set on fedjax_kd's config ``base`` (a ConfigDict) and
  validated, so a reference run and the fedjax_kd run of the same variant, cell and seed
  share their data, partition and draws.
  """
  grid = dict(grid or {})
  cells = [tuple(zip(grid, combo)) for combo in itertools.product(*grid.values())]
  runs = []
  for v in variants:
    _, fields = split_reference(v.fields)   # the switches are checked before anything runs
    for cell in cells:
      for s in seeds:
        cfg = without_reference(base).copy_and_resolve_references()
        sweep.apply_overrides(cfg, [*fields, *cell, *sweep.planning._pairs(overrides),  # pylint: disable=protected-access
                                    ('seed', int(s))])
        config_lib.validate(cfg)
        run = sweep.Run(v, cell, int(s), '', cfg)
        runs.append(dataclasses.replace(run, workdir=os.path.join(out, sweep.RUNS_DIR,
                                                                  run.name)))
  return runs


def execute(module, runs: Sequence[sweep.Run], threads: int = 0,
            log=print) -> list[dict[str, Any]]:
  """Runs every unfinished run (a finished one, by its ``summary.json``, is skipped).

  Returns the summaries in run order.
  """
  out = []
  for r in runs:
    summary = workdir_lib.read_json(r.workdir, 'summary.json')
    diverged = sweep.read_diverged(r.workdir)
    if sweep.is_complete(summary, r.rounds):
      log(f'{r.variant.label} seed {r.seed}: finished earlier (acc '
          f'{summary["final_acc"]:.4f}), skipped')
    elif diverged is not None:
      summary = {'diverged': diverged.get('round'), 'seed': r.seed}
      log(f'{r.variant.label} seed {r.seed}: diverged at round {diverged.get("round")} in an '
          'earlier call, skipped')
    else:
      options, _ = split_reference(r.variant.overrides)
      try:
        summary = run(module, export_setting(r.config, module.ALGORITHMS), options, r.seed,
                      r.workdir, threads, log)
      except DataError as e:   # another process runs it: left to that one
        log(f'{r.variant.label} seed {r.seed}: skipped: {e}')
        out.append({'seed': r.seed, 'error': str(e)})
        continue
      if 'diverged' not in summary:
        log(f'{r.variant.label} seed {r.seed}: final {summary["final_acc"]:.4f} in '
            f'{summary["wall_time_s"]:.0f} s')
    out.append(summary)
  return out
