"""Per-FedAvg: personalised federated learning as model-agnostic meta-learning.

A. Fallah, A. Mokhtari, A. Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020 (Algorithm 1 and its
first-order and Hessian-free variants, Sec. 5); a homogeneous personalised baseline of
ACE-pFL (He et al., IEEE/ACM ToN 2025, Table I). The global model ``w`` is trained so that
one gradient step of size ``alpha`` on a client's data personalises it, i.e. FedAvg on
``F_k(w) = f_k(w - alpha grad f_k(w))``. A round, for every participating client, from
``w``: each local step takes batches ``D, D' (, D'')`` and

* FO: ``w' = w - alpha grad f(w; D)``, ``w <- w - beta grad f(w'; D')``;
* HF: ``w <- w - beta (I - alpha H(w; D'')) grad f(w'; D')``
  (:func:`fedjax_kd.ops.personal.perfedavg_step`);

then the server averages the participants' ``w_k``. Byte rule: FedAvg's model exchange.

Personalised evaluation (``test_acc``): every client takes ``eval_steps`` gradient steps of
size ``alpha`` from the global model, each on a fresh minibatch of ``train.batch_size`` of
its own training rows (training mode), and the adapted model is scored on the client's
own test split with ``data.per_client_test`` (the unweighted mean over clients, ACE-pFL's
UA); ``global_acc`` / ``server_ua`` are the global model's.

Choices the paper leaves open (``docs/papers.md``):

* ``D, D', D''`` are the interleaved halves (FO) or thirds (HF) of the engine's one
  minibatch of ``train.batch_size`` per step (a part without a real sample uses the whole
  batch); the paper draws independent batches. Double ``train.batch_size`` for the paper's
  per-batch size.
* the HF Hessian-vector product is exact (``jax.jvp`` of the gradient), where the paper
  uses a finite difference with ``delta``; that pass leaves the BatchNorm statistics alone.
* defaults: ``alpha`` 0.01, ``beta`` 0.001, FO (as pFedMe's released comparison code and
  most re-implementations run it; the pFedMe repository's MNIST runs use alpha 0.005,
  beta 0.001). The Per-FedAvg paper's Table 1 reports alpha in {0.001, 0.01} with
  beta 0.001 (not re-checked against its PDF here).
* a round is ``train.epochs`` Keras-style epochs of meta steps (the paper's tau local
  steps); ``train.lr_decay`` scales ``beta`` only (``alpha`` is part of the objective);
  ``train.optimizer`` / ``learning_rate`` / ``momentum`` are not used.
* the server mean is the paper's plain mean over the participants (``weighted=True``:
  ``n_k`` weights as in pFedMe's code). BatchNorm statistics are averaged with the
  parameters.
* the pFedMe repository's evaluation adapts on *test* batches (``train_one_step``); here
  the adaptation uses the client's training rows only.

The local training runs under ``Federation.map_clients`` with pFedMe's loop
(:func:`fedjax_kd.core.loop.local_loop`): a meta step is not one optimizer update.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, broadcast, client_weights, round_epochs
from fedjax_kd.core import rng
from fedjax_kd.core.kernels import batch_rows
from fedjax_kd.core.loop import LoopOptions, batch_grad_fn, local_loop
from fedjax_kd.core.state import ModelState
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import personal

VARIANTS = ('fo', 'hf')


@dataclasses.dataclass(frozen=True)
class PerFedAvgLocal:
  """Static options of :func:`perfedavg_local`."""
  loop: LoopOptions
  hessian_free: bool


def perfedavg_local(kernels, st, key, row, shared, *, options: PerFedAvgLocal):
  """One client's Per-FedAvg round from its (broadcast) model ``st`` (``map_clients``).

  ``row = (idx, n, epochs_k)``; ``shared = (x, y, (alpha, beta))``.

  Returns:
    ``(w_k, batch_stats, mean loss)``.
  """
  idx, n, epochs_k = row
  x, y, (alpha, beta) = shared

  def step(fns, w, aux):
    return personal.perfedavg_step(fns, w, aux, alpha=alpha, beta=beta,
                                   hessian_free=options.hessian_free)

  w, stats, loss = local_loop(kernels, key, idx, n, epochs_k, x, y, st.params, st.batch_stats,
                              step, options.loop)
  return w, stats, loss


def random_batch(key: jax.Array, n_max: int, n: jax.Array, batch_size: int) -> jax.Array:
  """``[batch_size]`` positions of ``[0, n_max)``: ``min(n, batch_size)`` distinct real ones
  drawn uniformly, then the out-of-range ``n_max`` (padding)."""
  r = jax.random.uniform(key, (n_max,))
  r = jnp.where(jnp.arange(n_max) < n, r, 2.0)
  p = jnp.argsort(r).astype(jnp.int32)
  p = jnp.where(jnp.arange(n_max) < n, p, n_max)
  if n_max < batch_size:
    p = jnp.concatenate([p, jnp.full((batch_size - n_max,), n_max, jnp.int32)])
  return p[:batch_size]


@dataclasses.dataclass(frozen=True)
class AdaptOptions:
  """Static options of :func:`perfedavg_adapt`."""
  steps: int
  batch_size: int
  augment: Callable | None = None


def perfedavg_adapt(kernels, st, key, row, shared, *, options: AdaptOptions):
  """One client's personalised model: ``steps`` SGD steps of size ``alpha`` from ``st``.

  ``row = (idx, n)`` (the client's training rows), ``shared = (x, y, alpha)``; each step
  is one fresh minibatch (:func:`random_batch`) in training mode.

  Returns:
    ``(params, batch_stats)``.
  """
  idx, n = row
  x, y, alpha = shared
  n_max = idx.shape[0]
  w, aux = st.params, {'stats': st.batch_stats, 'loss': jnp.float32(0.0)}
  for s in range(options.steps):
    k_pos, k_aug, k_drop = jax.random.split(jax.random.fold_in(key, s), 3)
    pos = random_batch(k_pos, n_max, n, options.batch_size)
    rows, valid = batch_rows(idx, pos, n)
    xb = kernels.inputs(x[rows])
    if options.augment is not None:
      xb = options.augment(k_aug, xb)
    new = personal.sgd_steps((batch_grad_fn(kernels, xb, y[rows], valid, k_drop),), w, aux,
                             lr=alpha)
    w, aux = jax.tree.map(lambda a, b: jnp.where(jnp.any(valid), a, b), new, (w, aux))
  return w, aux['stats']


@jax.jit
def _average(server, params, stats, weights):
  return server.replace(params=param_aggregate.weighted_average(params, weights),
                        batch_stats=param_aggregate.weighted_average(stats, weights))


@dataclasses.dataclass(frozen=True)
class PerFedAvgOptions:
  """``perfedavg.*`` (defaults: see the module docstring)."""
  group: ClassVar[str] = 'perfedavg'
  alpha: float = options.option(0.01, 'the personalisation (inner) step size', gt=0)
  beta: float = options.option(0.001, 'the meta (outer) step size', gt=0)
  variant: str = options.option('fo', "'fo': first order; 'hf': Hessian-free, an exact "
                                'Hessian-vector product on a third part of the batch',
                                choices=VARIANTS)
  eval_steps: int = options.option(1, 'gradient steps of size alpha each client takes from '
                                   'the global model before it is evaluated (0: none)', ge=0)
  weighted: bool = options.option(False, "weight the mean by n_k instead of the paper's "
                                  'plain mean')


class PerFedAvg(FedAvg):
  """Per-FedAvg (see the module docstring)."""
  name = 'perfedavg'
  options_class = PerFedAvgOptions

  def round(self, state, r):
    o = self.options
    tr = self.spec.train
    (cohort,) = state.clients
    cohort = broadcast(cohort, state.server, jnp.asarray(r.active))
    d = r.fed.data
    hf = o.variant == 'hf'
    steps = (jnp.float32(o.alpha), jnp.float32(o.beta * self.lr_factor(r.t)))
    w_all, stats, loss = r.fed.map_clients(
        (cohort,), self.ctx.root, r.t, 'train', perfedavg_local, active=r.active,
        per_client=(d.client_idx, jnp.asarray(d.client_n, jnp.int32),
                    round_epochs(r, tr.epochs)),
        shared=(d.x_private, d.y_private, steps),
        fill=(cohort.params, cohort.batch_stats,
              jnp.full((r.num_clients,), jnp.nan, jnp.float32)),
        options=PerFedAvgLocal(LoopOptions(tr.epochs, tr.batch_size, 3 if hf else 2,
                                           self.augment), hf))
    server = _average(state.server, w_all, stats, client_weights(r, o.weighted))
    state = state.replace(clients=(cohort.replace(params=w_all, batch_stats=stats),),
                          server=server)
    return state, base.RoundOutput({'train_loss': base.nanmean(loss)}, self.payloads(r.active))

  def personalized(self, state) -> ModelState:
    """Every client's personalised model ``[K]``: the global model after ``eval_steps``
    steps of size ``alpha`` on its own training rows (the global model itself for 0)."""
    d = self.ctx.data
    k = self.num_clients
    kernels = self.server_model.kernels
    slots = jnp.zeros((k,), jnp.int32)   # every slot reads the server's one row
    keys = rng.client_keys(self.ctx.root, 0, np.arange(k), 'custom')
    params, stats = kernels.map_clients(
        perfedavg_adapt, state.server, slots, keys,
        (d.client_idx, jnp.asarray(d.client_n, jnp.int32)),
        (d.x_private, d.y_private, jnp.float32(self.options.alpha)),
        options=AdaptOptions(int(self.options.eval_steps), self.spec.train.batch_size,
                             self.augment))
    return ModelState(params=params, batch_stats=stats, opt_state={})

  def evaluate(self, state):
    out = self.client_metrics(state.replace(clients=(self.personalized(state),)), prefix='')
    g = self.server_metrics(state)
    out.update(global_acc=g['test_acc'], global_loss=g['test_loss'])
    out.update(self.server_split_metrics(state))
    return out
