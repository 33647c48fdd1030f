"""pFedMe: personalised federated learning with Moreau envelopes.

C. T. Dinh, N. H. Tran, T. D. Nguyen, "Personalized Federated Learning with Moreau
Envelopes", NeurIPS 2020 (Algorithm 1, eqs. 2-9); a homogeneous personalised baseline of
ACE-pFL (He et al., IEEE/ACM ToN 2025, Table I). Each client k keeps a personalised model
``theta_k`` tied to the global model by ``min_theta f_k(theta) + lam/2 ||theta - w||^2``.
A round, for every participating client, from the global ``w``:

* every local step takes one minibatch ``D`` and solves the personalised problem
  approximately, ``inner_steps`` (the paper's K) gradient steps at ``personal_lr``:
  ``theta <- theta - personal_lr (grad f(theta; D) + lam (theta - w_k))``
  (:func:`fedjax_kd.ops.personal.pfedme_personalize`), then moves the local model,
  ``w_k <- w_k - lr lam (w_k - theta)`` (eta = ``lr``);
* the server mixes: ``w <- (1 - beta) w + beta mean_S(w_k)`` over the participants.

The personalised ``theta_k`` is what ``test_acc`` measures (each client on its own test
split with ``data.per_client_test``; the unweighted mean over clients, as ACE-pFL reports
UA), so the client rows of the state hold ``theta_k``; ``global_acc`` / ``server_ua`` are
the global model's. Byte rule: FedAvg's model exchange (each participant uploads ``w_k``,
the server multicasts ``w``; parameters and BatchNorm statistics), one model each way.

Choices the paper leaves open (``docs/papers.md``):

* defaults: the paper's and its code's common non-convex MNIST setting ("using same
  parameters": ``lam`` 15, K 5, personal lr 0.09, eta 0.005, beta 1); the fine-tuned
  table uses beta 2, eta 0.01, lam 30, personal lr 0.05.
* local steps: the authors' code takes ``local_epochs`` (R = 20) minibatches per round;
  here a round is ``train.epochs`` Keras-style epochs of ``train.batch_size`` minibatches
  (``epochs * ceil(n_k / B)`` steps, stragglers' ``epochs_k`` honoured), like every other
  algorithm of the engine. ``train.lr_decay`` scales ``personal_lr`` and ``lr``;
  ``train.optimizer`` / ``learning_rate`` / ``momentum`` / ``weight_decay`` are not used.
* ``theta`` starts each round at the global ``w`` and is warm-started from one local step
  to the next (the authors' code; the paper only asks for a delta-approximate solution).
  The code's extra ``mu = 0.001`` L2 term in the inner step is not in the paper and is
  left out.
* only the participants (``clients.participation``) train; the paper lets all N clients
  run the local updates every round and only the sampled ones upload. A client's ``theta``
  is kept until it next takes part.
* the server mean is the paper's plain mean over the participants (``weighted=True``: the
  code's ``n_k`` weights). BatchNorm statistics (the paper's models have none) follow the
  forward passes of the inner solve and are averaged without the beta mix.

The local training is a client program of its own (:class:`PFedMeLocal`), not the engine's
:class:`~fedjax_kd.core.program.SGD`: pFedMe's step is not one optimizer update of one loss,
and each client ends with two models (``w_k`` to upload and ``theta_k`` to keep).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, client_weights
from fedjax_kd.core.program import Batches, Program, part_grad_fns
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import personal


def first_row(tree: Any) -> Any:
  """Row 0 of every leaf (the server model's single row)."""
  return jax.tree.map(lambda a: a[0], tree)


# ------------------------------------------------------------------ pFedMe
@dataclasses.dataclass(frozen=True)
class PFedMeLocal(Program):
  """One client's pFedMe round from the global model, on its private rows (Keras-style
  epochs of ``batch_size``).

  Inputs: ``shared = {'w', 'batch_stats': the global model (one row), 'steps': (lam,
  personal_lr, lr)}``. Every step solves the personalised problem on its batch
  (``inner_steps`` gradient steps, warm-started) and moves ``w_k`` towards it. The client
  keeps ``theta_k`` (its stored model, with the statistics of the inner solve's passes) and
  uploads ``w_k`` (its output).
  """
  epochs: int
  batch_size: int
  inner_steps: int
  augment: Any = None

  @property
  def batches(self):
    return Batches(self.epochs, self.batch_size, augment=self.augment)

  def init(self, c, row, shared):
    w0 = shared['w']
    return (w0, w0), {'stats': shared['batch_stats'], 'loss': jnp.float32(0.0)}

  def step(self, c, carry, batch, row, shared):
    (w, theta), aux = carry
    lam, plr, eta = shared['steps']
    (fn,) = part_grad_fns(c, batch, 1)
    theta, aux = personal.pfedme_personalize(fn, theta, w, aux, lam=lam, lr=plr,
                                             steps=self.inner_steps)
    return ((personal.pfedme_local_update(w, theta, lam=lam, eta=eta), theta), aux), aux['loss']

  def final(self, c, carry, row, shared):
    (w, theta), aux = carry
    return c.model.replace(params=theta, batch_stats=aux['stats']), w


@jax.jit
def _mix_server(server, w_all, stats_all, weights, beta):
  """The server's model after pFedMe's beta mix (parameters) and the plain mean (stats)."""
  mean = param_aggregate.weighted_average(w_all, weights)
  return server.replace(params=personal.pfedme_server_update(server.params, mean, beta),
                        batch_stats=param_aggregate.weighted_average(stats_all, weights))


@dataclasses.dataclass(frozen=True)
class PFedMeOptions:
  """``pfedme.*`` (defaults: the paper's non-convex MNIST setting, see the module doc)."""
  group: ClassVar[str] = 'pfedme'
  lam: float = options.option(15.0, 'lambda: the weight of ||theta - w||^2 / 2', gt=0)
  inner_steps: int = options.option(5, 'K: gradient steps of the personalised problem per '
                                    'local step', ge=1)
  personal_lr: float = options.option(0.09, 'the step size of those K steps', gt=0)
  lr: float = options.option(0.005, 'eta: the local model step w -= eta lam (w - theta)',
                             gt=0)
  beta: float = options.option(1.0, 'the server mix w = (1 - beta) w + beta mean(w_k) '
                               '(1: plain averaging; the fine-tuned runs use 2)', gt=0)
  weighted: bool = options.option(False, "weight the mean by n_k (the authors' code) "
                                  "instead of the paper's plain mean")


class PFedMe(FedAvg):
  """pFedMe (see the module docstring)."""
  name = 'pfedme'
  options_class = PFedMeOptions

  def local(self) -> PFedMeLocal:
    tr = self.spec.train
    return PFedMeLocal(tr.epochs, tr.batch_size, int(self.options.inner_steps), self.augment)

  def _shared(self, server, t: int) -> dict:
    o = self.options
    f = self.lr_factor(t)
    steps = jnp.asarray((o.lam, o.personal_lr * f, o.lr * f), jnp.float32)
    return {'w': first_row(server.params), 'batch_stats': first_row(server.batch_stats),
            'steps': (steps[0], steps[1], steps[2])}

  def programs(self, shapes):
    return (base.planned(self.local(), self.private_rows(), None,
                         jax.eval_shape(lambda s: self._shared(s, 1), shapes.server)),)

  def round(self, state, r):
    o = self.options
    ran = r.fed.run(self.local(), state.clients, self.ctx.root, r.t, 'train',
                    data=self.private_rows(r.fed), shared=self._shared(state.server, r.t),
                    active=r.active, epochs=r.epochs_k)
    (theta,) = ran.states
    server = _mix_server(state.server, ran.out, theta.batch_stats, client_weights(r, o.weighted),
                         jnp.float32(o.beta))
    state = state.replace(clients=ran.states, server=server)
    return state, base.RoundOutput({'train_loss': base.nanmean(ran.metrics)},
                                   self.payloads(r.active))

  def evaluate(self, state):
    # test_acc: the personalised theta_k (UA with data.per_client_test), then the global w.
    out = self.client_metrics(state, prefix='')
    g = self.server_metrics(state)
    out.update(global_acc=g['test_acc'], global_loss=g['test_loss'])
    out.update(self.server_split_metrics(state))
    return out
