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

The local training is a client program of its own (:class:`PerFedAvgLocal`): a meta step is
not one optimizer update; the evaluation's adaptation is another (:class:`Adapt`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import jax
import jax.numpy as jnp

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, broadcast, client_weights
from fedjax_kd.core.program import Batches, Program, grad_fn, part_grad_fns
from fedjax_kd.core.state import ModelState
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import personal

VARIANTS = ('fo', 'hf')


@dataclasses.dataclass(frozen=True)
class PerFedAvgLocal(Program):
  """One client's Per-FedAvg round from its (broadcast) model: Keras-style epochs of
  ``batch_size`` on its private rows, each batch split into ``D, D' (, D'')`` for the meta
  step (``shared['steps'] = (alpha, beta)``; ``hessian_free``: the HF variant)."""
  epochs: int
  batch_size: int
  hessian_free: bool
  augment: Callable | None = None

  @property
  def batches(self):
    return Batches(self.epochs, self.batch_size, augment=self.augment)

  def init(self, c, row, shared):
    return c.model.params, {'stats': c.model.batch_stats, 'loss': jnp.float32(0.0)}

  def step(self, c, carry, batch, row, shared):
    w, aux = carry
    alpha, beta = shared['steps']
    fns = part_grad_fns(c, batch, 3 if self.hessian_free else 2)
    w, aux = personal.perfedavg_step(fns, w, aux, alpha=alpha, beta=beta,
                                     hessian_free=self.hessian_free)
    return (w, aux), aux['loss']

  def final(self, c, carry, row, shared):
    w, aux = carry
    return c.model.replace(params=w, batch_stats=aux['stats']), None


@dataclasses.dataclass(frozen=True)
class Adapt(Program):
  """A client's personalised model: ``steps`` SGD steps of size ``shared['alpha']`` from the
  global model ``shared['w']`` (with its statistics ``shared['batch_stats']``), each on a
  fresh batch of ``batch_size`` distinct rows of its own, in training mode. Outputs
  ``(params, batch_stats)``; the stored models are not read."""
  steps: int
  batch_size: int
  augment: Callable | None = None
  writes = False

  @property
  def batches(self):
    return Batches(1, self.batch_size, order='random', steps=self.steps, augment=self.augment)

  def init(self, c, row, shared):
    return shared['w'], {'stats': shared['batch_stats'], 'loss': jnp.float32(0.0)}

  def step(self, c, carry, batch, row, shared):
    w, aux = carry
    fn = grad_fn(c, batch.data['x'], batch.data['y'], batch.valid, batch.key)
    return personal.sgd_steps((fn,), w, aux, lr=shared['alpha']), None

  def final(self, c, carry, row, shared):
    w, aux = carry
    return None, (w, aux['stats'])


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

  def local(self) -> PerFedAvgLocal:
    tr = self.spec.train
    return PerFedAvgLocal(tr.epochs, tr.batch_size, self.options.variant == 'hf', self.augment)

  def adapt(self) -> Adapt:
    return Adapt(int(self.options.eval_steps), self.spec.train.batch_size, self.augment)

  def _steps(self, t: int) -> dict:
    o = self.options
    return {'steps': (jnp.float32(o.alpha), jnp.float32(o.beta * self.lr_factor(t)))}

  def _global(self, server) -> dict:
    return {'w': jax.tree.map(lambda a: a[0], server.params),
            'batch_stats': jax.tree.map(lambda a: a[0], server.batch_stats),
            'alpha': jnp.float32(self.options.alpha)}

  def programs(self, shapes):
    rows = self.private_rows()
    return (base.planned(self.local(), rows, None, self._steps(1)),
            base.planned(self.adapt(), rows, None, jax.eval_shape(self._global, shapes.server)))

  def round(self, state, r):
    o = self.options
    (cohort,) = state.clients
    cohort = broadcast(cohort, state.server, jnp.asarray(r.active))
    ran = r.fed.run(self.local(), (cohort,), self.ctx.root, r.t, 'train',
                    data=self.private_rows(r.fed), shared=self._steps(r.t), active=r.active,
                    epochs=r.epochs_k)
    (trained,) = ran.states
    server = _average(state.server, trained.params, trained.batch_stats,
                      client_weights(r, o.weighted))
    state = state.replace(clients=ran.states, server=server)
    return state, base.RoundOutput({'train_loss': base.nanmean(ran.metrics)},
                                   self.payloads(r.active))

  def personalized(self, state) -> ModelState:
    """Every client's personalised model ``[K]``: the global model after ``eval_steps``
    steps of size ``alpha`` on its own training rows (the global model itself for 0)."""
    ran = self.ctx.fed.run(self.adapt(), state.clients, self.ctx.root, 0, 'custom',
                           data=self.private_rows(), shared=self._global(state.server))
    params, stats = ran.out
    return ModelState(params=params, batch_stats=stats, opt_state={})

  def evaluate(self, state):
    out = self.client_metrics(state.replace(clients=(self.personalized(state),)), prefix='')
    g = self.server_metrics(state)
    out.update(global_acc=g['test_acc'], global_loss=g['test_loss'])
    out.update(self.server_split_metrics(state))
    return out
