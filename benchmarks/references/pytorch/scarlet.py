"""SCARLET and DS-FL in SCARLET's round order, in PyTorch (K. Azuma, T. Nishio, Y. Kitagawa,
W. Nakano, T. Tanimura, "Soft-Label Caching and Sharpening for Communication-Efficient
Federated Distillation", arXiv 2504.19602, Algorithms 1 and 2, Eq. 4).

One round ``t``, in the order of the authors' code (DS-FL is their baseline and runs the same
order without the cache):

  1. every client distils on the labels the server produced in round ``t - 1`` (soft-label
     cross-entropy); with the cache, a client rebuilds them from its own copy of the cache
     and the fresh labels it received;
  2. every client trains on its private data (cross-entropy);
  3. the server draws ``I^t`` (|P^t| public samples) and requests only those it holds no
     valid label for: an entry cached in round ``t_c`` is valid while ``t - t_c <= D``;
  4. every client predicts the requested samples in inference mode and uploads softmax
     probabilities; the server averages them and sharpens the average: SCARLET's Enhanced
     ERA ``p^beta / sum_c p_c^beta``, DS-FL's ERA ``softmax(mean / T)``;
  5. cache (Algorithm 2): a valid entry is reused as stored, a missing one is stored with
     stamp ``t``, an expired one is dropped and its fresh label used once;
  6. the server model distils on the round's labels and is scored on the test set.

The cache is a Python dict (public index -> (label, stamp)), the way a reference would
write it; every client holds the same entries as the server under full participation, so
one copy stands for them (the reference does not model partial participation). Rows carry
``test_acc`` (server model), ``client_acc`` (mean of each client model's accuracy on its own
test split, after local training), ``hit_ratio`` (the share of ``I^t`` served from the
cache), ``label_acc`` (the labels' argmax is the true class, a diagnostic) and ``entropy``.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator

import numpy as np

from benchmarks.references.pytorch import common

ALGORITHMS = ('scarlet', 'dsfl')
CONFIG = 'configs/scarlet_mnist_cpu.py'
FIXED = ()
METRICS = ('hit_ratio', 'label_acc', 'client_acc')
VARIANTS = {
    'scarlet': ('PyTorch SCARLET', 'scarlet', {}),
    'dsfl': ('PyTorch DS-FL ERA (SCARLET order)', 'dsfl', {}),
}
# Lock-step: fedjax_kd's initial weights (of a run with model.init=torch, PyTorch's family),
# minibatch order and biased BatchNorm running variance.
LOCKSTEP = {**common.LOCKSTEP, 'model.init': 'torch'}
VARIANTS.update({
    'scarlet_lockstep': ('PyTorch SCARLET, lock-step', 'scarlet', LOCKSTEP),
    'dsfl_lockstep': ('PyTorch DS-FL ERA (SCARLET order), lock-step', 'dsfl', LOCKSTEP),
})
DEFAULT_VARIANTS = ('scarlet', 'dsfl')


def enhanced_era(mean, beta: float):
  """SCARLET's Eq. 4: ``mean^beta`` renormalised over classes (zeros stay zero)."""
  p = mean.clamp_min(0) ** beta
  return p / p.sum(1, keepdim=True)


def era(mean, temperature: float):
  """DS-FL's ERA: a softmax over the averaged probabilities at temperature ``T``."""
  import torch  # pylint: disable=g-import-not-at-top
  return torch.softmax(mean / temperature, 1)


class LabelCache:
  """The server's soft-label cache (Algorithm 2): public index -> (label, round cached)."""

  def __init__(self, duration: int):
    self.duration = duration
    self.entries: dict[int, tuple[Any, int]] = {}

  def valid(self, i: int, t: int) -> bool:
    e = self.entries.get(i)
    return e is not None and t - e[1] <= self.duration

  def merge(self, draw: np.ndarray, fresh: dict[int, Any], t: int) -> tuple[list, int]:
    """The round's label of every drawn index, and how many came from the cache.

    ``fresh``: the aggregated label of each requested index.
    """
    labels, hits = [], 0
    for i in (int(i) for i in draw):
      if self.valid(i, t):
        labels.append(self.entries[i][0])
        hits += 1
      elif i in self.entries:        # expired: dropped, its fresh label used once
        del self.entries[i]
        labels.append(fresh[i])
      else:                          # new: stored with this round's stamp
        self.entries[i] = (fresh[i], t)
        labels.append(fresh[i])
    return labels, hits


def rounds(ctx) -> Iterator[dict[str, Any]]:
  """Yields one metrics row per round."""
  torch = ctx.torch
  s, spec = ctx.setting, ctx.setting.spec
  opts, algo = spec.options, spec.algorithm
  if algo == 'dsfl' and (opts.aggregation != 'era' or opts.schedule != 'next_round'):
    raise ValueError('dsfl.aggregation / dsfl.schedule: this reference runs ERA in SCARLET\'s '
                     f'order, got {opts.aggregation!r} / {opts.schedule!r}')
  if spec.partial:
    raise ValueError('clients.participation: the reference runs full participation only')
  cache_on = opts.cache.enabled
  cache = LabelCache(opts.cache.duration) if cache_on else None
  if s.config['clients'].get('shared_init'):   # the authors' code: every model starts equal
    first = ctx.model(None)
    clients = [copy.deepcopy(first) for _ in range(ctx.num_clients)]
    server = copy.deepcopy(first)
  else:
    clients = [ctx.model(k) for k in range(ctx.num_clients)]
    server = ctx.model(None)
  prev = None     # (x, labels) of round t - 1
  for t, draw in enumerate(s.draws, start=1):
    distill_loss = float('nan')
    if prev is not None:
      distill_loss = float(np.mean([ctx.fit(m, *prev, s.distill, soft=True, t=t, who=k,
                                            phase='distill') for k, m in enumerate(clients)]))
    train_loss = float(np.mean([ctx.fit(m, x, y, s.train, soft=False, t=t, who=k,
                                        phase='train')
                                for k, (m, (x, y)) in enumerate(zip(clients, ctx.data))]))
    requested = [int(i) for i in draw if not (cache_on and cache.valid(int(i), t))]
    # The authors' order: the requested samples first, then the cached ones, each in draw
    # order; the labels, and the batches of both distillations, follow it.
    asked = set(requested)
    draw = np.array(requested + [int(i) for i in draw if int(i) not in asked], np.int64)
    fresh: dict[int, Any] = {}
    if requested:
      x_req = ctx.x_pub[torch.tensor(requested)]
      mean = torch.stack([ctx.predict(m, x_req) for m in clients]).mean(0)
      agg = enhanced_era(mean, opts.beta) if algo == 'scarlet' else era(mean, opts.temperature)
      fresh = dict(zip(requested, agg))
    if cache_on:
      labels, hits = cache.merge(draw, fresh, t)
    else:
      labels, hits = [fresh[int(i)] for i in draw], 0
    labels = torch.stack(labels)
    j = torch.from_numpy(draw.astype(np.int64))
    x_or = ctx.x_pub[j]
    server_loss = ctx.fit(server, x_or, labels, s.distill, soft=True, t=t, who=None,
                          phase='distill')
    prev = (x_or, labels)
    yield {'round': t, 'test_acc': ctx.test_acc(server),
           'client_acc': ctx.mean_client_acc(clients),
           'hit_ratio': hits / len(draw),
           'label_acc': float((labels.argmax(1) == ctx.y_pub[j]).float().mean()),
           'entropy': float(-(labels * torch.log(labels.clamp_min(1e-30))).sum(1).mean()),
           'train_loss': train_loss, 'distill_loss': distill_loss,
           'server_distill_loss': server_loss}
