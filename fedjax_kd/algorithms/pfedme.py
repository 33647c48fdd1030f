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

The local training is one vmapped function per client
(:func:`fedjax_kd.core.loop.local_loop` under ``Federation.map_clients``) rather than the engine's optimizer-step ``fit``: pFedMe's step
is not one optimizer update of one loss, and each client returns two models (``w_k`` to
upload and ``theta_k`` to keep), where ``fit`` returns one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, client_weights, round_epochs
from fedjax_kd.core.loop import LoopOptions, local_loop
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import personal


def first_row(tree: Any) -> Any:
  """Row 0 of every leaf (the server model's single row)."""
  return jax.tree.map(lambda a: a[0], tree)


# ------------------------------------------------------------------ pFedMe
@dataclasses.dataclass(frozen=True)
class PFedMeLocal:
  """Static options of :func:`pfedme_local`."""
  loop: LoopOptions
  inner_steps: int


def pfedme_local(kernels, st, key, row, shared, *, options: PFedMeLocal):
  """One client's pFedMe round (under ``Federation.map_clients``).

  Args:
    kernels: the cohort's kernels.
    st: the client's stored state (unused: the round starts from the global model).
    key: the client's key of the round.
    row: ``(idx [n_max], n, epochs_k)``: its rows of the private data, their count and its
      epoch budget.
    shared: ``(x, y, w, batch_stats, (lam, personal_lr, lr))``: the private pool, the
      global model (one row) and the step sizes.
    options: the loop's static options and K.

  Returns:
    ``(w_k, theta_k, batch_stats, mean loss)``.
  """
  del st
  idx, n, epochs_k = row
  x, y, w0, stats0, (lam, plr, eta) = shared

  def step(fns, carry, aux):
    w, theta = carry
    theta, aux = personal.pfedme_personalize(fns[0], theta, w, aux, lam=lam, lr=plr,
                                             steps=options.inner_steps)
    return (personal.pfedme_local_update(w, theta, lam=lam, eta=eta), theta), aux

  (w, theta), stats, loss = local_loop(kernels, key, idx, n, epochs_k, x, y, (w0, w0), stats0,
                                       step, options.loop)
  return w, theta, stats, loss


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

  def _local_options(self) -> PFedMeLocal:
    tr = self.spec.train
    return PFedMeLocal(LoopOptions(tr.epochs, tr.batch_size, 1, self.augment),
                       int(self.options.inner_steps))

  def round(self, state, r):
    o = self.options
    (cohort,) = state.clients
    d = r.fed.data
    f = self.lr_factor(r.t)
    steps = jnp.asarray((o.lam, o.personal_lr * f, o.lr * f), jnp.float32)
    w_all, theta, stats, loss = r.fed.map_clients(
        state.clients, self.ctx.root, r.t, 'train', pfedme_local, active=r.active,
        per_client=(d.client_idx, jnp.asarray(d.client_n, jnp.int32),
                    round_epochs(r, self.spec.train.epochs)),
        shared=(d.x_private, d.y_private, first_row(state.server.params),
                first_row(state.server.batch_stats), (steps[0], steps[1], steps[2])),
        fill=(cohort.params, cohort.params, cohort.batch_stats,
              jnp.full((r.num_clients,), jnp.nan, jnp.float32)),
        options=self._local_options())
    server = _mix_server(state.server, w_all, stats, client_weights(r, o.weighted),
                         jnp.float32(o.beta))
    state = state.replace(clients=(cohort.replace(params=theta, batch_stats=stats),),
                          server=server)
    return state, base.RoundOutput({'train_loss': base.nanmean(loss)}, self.payloads(r.active))

  def evaluate(self, state):
    # test_acc: the personalised theta_k (UA with data.per_client_test), then the global w.
    out = self.client_metrics(state, prefix='')
    g = self.server_metrics(state)
    out.update(global_acc=g['test_acc'], global_loss=g['test_loss'])
    out.update(self.server_split_metrics(state))
    return out
