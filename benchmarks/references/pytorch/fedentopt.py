"""FedAvg, FedProx, SCAFFOLD and FedNova in PyTorch, on FedEntOpt's client cohorts.

M. Lutz et al., "Entropy-based client selection" (FedEntOpt, arXiv 2411.01240v2, §V-B4)
pairs its selection with four parameter-averaging methods as NIID-Bench (Q. Li, Y. Diao,
Q. Chen, B. He, "Federated Learning on Non-IID Data Silos: An Experimental Study", ICDE
2022) runs them, each written here from its paper:

* FedAvg (McMahan et al., AISTATS 2017): ``theta <- sum_S p_k theta_k``, ``p_k = n_k / n_S``.
* FedProx (Li et al., MLSys 2020): local loss plus ``mu / 2 ||w - theta||^2``.
* SCAFFOLD (Karimireddy et al., ICML 2020, option II): after every ``optimizer.step()``
  ``w <- w - lr (c - c_k)``; after ``tau_k`` steps ``c_k+ = c_k - c + (theta - w) /
  (tau_k lr)``; the server averages the models and sets ``c <- c + (1 / N) sum_S
  (c_k+ - c_k)`` over all ``N`` clients.
* FedNova (Wang et al., NeurIPS 2020) for SGD with momentum ``rho``: ``a_k = [tau_k -
  rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)``, ``theta <- theta - (sum p_k a_k)
  sum p_k (theta - theta_k) / a_k``.

Every selected client copies the global model and trains it with a new
``torch.optim.SGD`` (momentum, coupled weight decay) for the round's learning rate
``lr * decay^(t-1)``. The cohorts of each round come from fedjax_kd's selector for the
seed (uniform or FedEntOpt's entropy schedule; they need no training). Rows carry the global
model's ``test_acc`` and ``train_loss``, and ``param_norm`` / ``control_norm`` (SCAFFOLD's
``||c||``), which show how a run that diverges gets there; a round whose global model holds a
NaN or Inf stops the run as fedjax_kd's runner does.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Iterator

import numpy as np

from benchmarks.references.pytorch import common

ALGORITHMS = ('fedavg', 'fedprox', 'scaffold', 'fednova')
CONFIG = 'configs/fedentopt_mnist_cpu.py'
# variant key -> (label, fedjax_kd algorithm, fedjax_kd fields). '<algorithm>_fedjax_init'
# starts from fedjax_kd's initial weights (Flax's LeCun-normal LeNet-5, about 1.7 times
# PyTorch's default scale) instead of PyTorch's own draw: the one switch between the two
# defaults.
VARIANTS = {a: (f'PyTorch {n}', a, {})
            for a, n in zip(ALGORITHMS, ('FedAvg', 'FedProx', 'SCAFFOLD', 'FedNova'))}
VARIANTS.update({f'{a}_fedjax_init': (f'PyTorch {n}, fedjax_kd init', a,
                                        {'reference.init': 'fedjax'})
                 for a, n in zip(ALGORITHMS, ('FedAvg', 'FedProx', 'SCAFFOLD', 'FedNova'))})
# '<algorithm>_lockstep': fedjax_kd's initial weights, minibatch order and biased BatchNorm
# running variance, so the two implementations compute the same rounds up to float rounding.
VARIANTS.update({f'{a}_lockstep': (f'PyTorch {n}, lock-step', a, dict(common.LOCKSTEP))
                 for a, n in zip(ALGORITHMS, ('FedAvg', 'FedProx', 'SCAFFOLD', 'FedNova'))})
DEFAULT_VARIANTS = ALGORITHMS
FIXED = ()
METRICS = ('param_norm', 'control_norm')


def _norm(tensors) -> float:
  return float(math.sqrt(sum(float((t.detach().double() ** 2).sum()) for t in tensors)))


def rounds(ctx) -> Iterator[dict[str, Any]]:
  """Yields one metrics row per round."""
  torch = ctx.torch
  s, spec = ctx.setting, ctx.setting.spec
  algo, tr = spec.algorithm, spec.train
  if tr.optimizer != 'sgd':
    raise ValueError(f'train.optimizer: the reference runs SGD, got {tr.optimizer!r}')
  rho, wd = float(tr.momentum), float(tr.weight_decay)
  mu = spec.options.mu if algo == 'fedprox' else 0.0
  selector = s.experiment.ctx.selector
  n = np.array([len(r) for r in s.client_rows], np.float64)
  glob = ctx.model(None)
  zeros = lambda: [torch.zeros_like(p) for p in glob.parameters()]
  c, c_k = (zeros(), [None] * ctx.num_clients) if algo == 'scaffold' else (None, None)
  for t in range(1, spec.rounds + 1):
    ids = np.flatnonzero(selector.plan(t).active)
    lr = tr.learning_rate * tr.lr_decay ** (t - 1)
    start = [p.detach().clone() for p in glob.parameters()]
    p_k = n[ids] / n[ids].sum()
    new, taus, losses, c_delta = [], [], [], None
    for k in ids:
      local = copy.deepcopy(glob)
      penalty = after = None
      if algo == 'fedprox':
        penalty = lambda m=local: mu / 2 * sum(((w - w0) ** 2).sum()
                                               for w, w0 in zip(m.parameters(), start))
      if algo == 'scaffold':
        ck = c_k[k] if c_k[k] is not None else zeros()

        def after(m=local, ck=ck):
          with torch.no_grad():
            for w, cs, cl in zip(m.parameters(), c, ck):
              w.sub_(lr * (cs - cl))
      x, y = ctx.data[k]
      losses.append(ctx.fit(local, x, y, (tr.epochs, tr.batch_size, lr), soft=False, t=t,
                            who=int(k), phase='train', momentum=rho, weight_decay=wd,
                            penalty=penalty, after_step=after))
      tau = ctx.steps_run
      taus.append(tau)
      new.append([p.detach() for p in local.parameters()])
      if algo == 'scaffold':
        ck_new = [cl - cs + (w0 - w) / (tau * lr)
                  for cl, cs, w0, w in zip(ck, c, start, new[-1])]
        d = [a - b for a, b in zip(ck_new, ck)]
        c_delta = d if c_delta is None else [a + b for a, b in zip(c_delta, d)]
        c_k[k] = ck_new
    with torch.no_grad():
      if algo == 'fednova':
        tau = np.array(taus, np.float64)
        a = (tau - rho * (1 - rho ** tau) / (1 - rho)) / (1 - rho) if rho else tau
        tau_eff = float((p_k * a).sum())
        for i, w in enumerate(glob.parameters()):
          d = sum(float(p_k[j] / a[j]) * (start[i] - new[j][i]) for j in range(len(ids)))
          w.copy_(start[i] - tau_eff * d)
      else:
        for i, w in enumerate(glob.parameters()):
          w.copy_(sum(float(p_k[j]) * new[j][i] for j in range(len(ids))))
      if algo == 'scaffold':
        c = [cs + d / ctx.num_clients for cs, d in zip(c, c_delta)]
    row = {'round': t, 'train_loss': float(np.mean(losses)),
           'param_norm': _norm(glob.parameters())}
    if c is not None:
      row['control_norm'] = _norm(c)
    if not all(bool(torch.isfinite(w).all()) for w in glob.parameters()):
      row['nonfinite'] = f'the global model holds NaN or Inf after round {t}'
      yield row
      return
    row['test_acc'] = ctx.test_acc(glob)
    yield row
