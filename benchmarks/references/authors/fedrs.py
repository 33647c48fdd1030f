"""FedRS (Li and Zhan, KDD 2021) beside its authors' code: FedRepo's ``algorithms/fedrs.py``.

Their class ``FedRS`` runs unchanged, its own ``train()`` loop included (client sampling, the
restricted-softmax local steps, gradient clipping, the count-weighted average, the global
test). Around it the driver supplies:

* the data: ``construct_dataloaders`` (imported by their module) returns loaders that yield
  fedjax_kd's minibatches of each client and round (:class:`common.Batches`, which also has
  the ``.next()`` their Python 2 style ``loader_iter.next()`` calls);
* the model: their code reads ``hs, logits = model(x)`` and the bias-free
  ``model.classifier.weight``, and scales ``hs W^T``. fedjax_kd's MLP ends in a biased Dense
  layer and scales ``W h + b``; the twin here feeds ``[h, 1]`` to a bias-free classifier
  ``[W | b]``, the same function with the same gradients, so their formula meets ours exactly;
* the args: fedjax_kd's learning rate, batch size and one local epoch (their
  ``max(epochs * len(loader), 5)`` steps equal fedjax_kd's ``epochs * ceil(n / B)`` here);
  ``max_grad_norm`` infinite (clipping is not part of FedRS; fedjax_kd does not clip, and
  the run with their default of 10 is reported beside as a measured difference);
* ``pandas`` (imported by their ``utils.py``, never called here) as an empty module.

fedjax_kd runs ``fedrs.proportional=True``, the scales their code uses (``alpha + (1 - alpha)
n_c / max n``); the paper's binary scales are fedjax_kd's default.
"""

from __future__ import annotations

import math

import numpy as np

from benchmarks.references.authors import common

ALPHA = 0.5


def config(rounds: int = 3, seed: int = 0):
  return common.tiny('fedrs', rounds, seed=seed,
                     **{'fedrs.alpha': ALPHA, 'fedrs.proportional': True})


def lockstep(path: str, seed: int = 0, rounds: int = 3, max_grad_norm: float = math.inf,
             ours_run: common.Ours | None = None) -> common.Result:
  torch = common.need_torch()
  nn = torch.nn
  run = ours_run or common.ours(config(rounds, seed))
  s = run.setting
  spec = s.spec
  epochs, batch_size, lr = s.train

  class Twin(nn.Module):
    """fedjax_kd's MLP as FedRepo's networks are called: ``hs, logits = model(x)``."""

    def __init__(self, mlp):
      super().__init__()
      self.body = mlp[:-1]
      head = mlp[-1]
      self.classifier = nn.Linear(head.in_features + 1, head.out_features, bias=False)
      with torch.no_grad():
        self.classifier.weight.copy_(torch.cat([head.weight, head.bias[:, None]], 1))

    def forward(self, x):
      h = self.body(x)
      hs = torch.cat([h, torch.ones(h.shape[0], 1)], 1)
      return hs, self.classifier(hs)

  @torch.no_grad()
  def diff(twin, variables) -> float:
    mlp = common.torch_model(run, variables)
    w = torch.cat([mlp[-1].weight, mlp[-1].bias[:, None]], 1)
    head = float((twin.classifier.weight - w).abs().max())
    body = max(float((a - b).abs().max()) for a, b in zip(twin.body.state_dict().values(),
                                                          mlp[:-1].state_dict().values()))
    return max(head, body)

  class Set:
    def __init__(self, x, y):
      self.xs, self.ys = x, y

  class Plain:
    """A test loader: the whole set as one batch."""

    def __init__(self, x, y):
      self.x, self.y = common.nchw(x), torch.from_numpy(np.asarray(y, np.int64))

    def __iter__(self):
      return iter([(self.x, self.y)])

  k_clients = len(s.client_rows)
  data = [run.client_data(k) for k in range(k_clients)]
  loaders = []
  for k, (x, y) in enumerate(data):
    b = common.Batches(x, y, -(-len(y) // batch_size))
    b.k = k
    loaders.append(b)

  def dataloaders(clients, csets, gset, args):
    del csets, gset, args
    return ({c: loaders[c] for c in clients}, {c: Plain(*data[c]) for c in clients},
            Plain(s.x_test, s.y_test))

  diffs, theirs_acc = [], []
  with common.imported_from(path):
    import algorithms.fedrs as mod  # pylint: disable=g-import-not-at-top
    mod.construct_dataloaders = dataloaders

    class Driven(mod.FedRS):
      """Their FedRS; each round's minibatches set, every model compared after the round."""

      def update_local(self, r, model, train_loader, test_loader, dist):
        train_loader.steps = run.order(r, train_loader.k, 'train', len(train_loader.y),
                                       epochs, batch_size)
        return super().update_local(r, model, train_loader, test_loader, dist)

      def update_global(self, r, global_model, local_models, weights):
        super().update_global(r, global_model, local_models, weights)
        d = [diff(local_models[k], run.client(r, k)) for k in local_models]
        diffs.append(max(d + [diff(global_model, run.server(r))]))

    args = common.namespace(
        n_classes=s.num_classes, max_round=len(run.rows), c_ratio=1.0, lr=lr,
        optimizer='SGD', momentum=spec.train.momentum, weight_decay=spec.train.weight_decay,
        local_steps=None, local_epochs=epochs, batch_size=batch_size, alpha=ALPHA,
        max_grad_norm=max_grad_norm, cuda=False, test_round=1)
    csets = {k: (Set(*data[k]), Set(*data[k])) for k in range(k_clients)}
    np.random.seed(seed)
    algo = Driven(csets, Set(s.x_test, s.y_test), Twin(common.torch_model(run, run.server(0))),
                  args)
    algo.train()
    theirs_acc = [float(a) for a in algo.logs['GLO_TACCS']]
  return common.Result(
      baseline='fedrs', repo=common.REPOS['fedrs'], rounds=len(run.rows), param_diff=diffs,
      acc_ours=[r['test_acc'] for r in run.rows], acc_theirs=theirs_acc,
      what='every local model and the global model after each round; global test accuracy',
      notes=('fedrs.proportional=True (their scales); max_grad_norm '
             f'{"off" if math.isinf(max_grad_norm) else max_grad_norm}',))


def clipping_effect(path: str, seed: int = 0, rounds: int = 3) -> float:
  """The largest parameter difference their default clipping (``max_grad_norm=10``) makes."""
  run = common.ours(config(rounds, seed))
  return max(lockstep(path, seed, rounds, 10.0, ours_run=run).param_diff)

