"""MTFL: multi-task FL with private BatchNorm layers and a FedAdam server.

J. Mills, J. Hu, G. Min, "Multi-Task Federated Learning for Personalised Deep
Neural Networks in Edge Computing", IEEE Transactions on Parallel and
Distributed Systems 33(3), 2022 (arXiv 2007.09236); the authors' code
github.com/JedMills/MTFL-For-Personalised-DNNs (``-alg fedadam``, their
``run_fedavg_google`` with ``ServerAdam``). FedCache 2.0 (Pan et al., arXiv
2405.13378, Table III) runs it as a baseline with server_lr 0.01, beta1 0.9,
beta2 0.999, ``bn_private usyb`` and C = 0.5 (``clients.participation``).

A round (Algorithm 1 of the paper with the adaptive server optimiser, Sec. 4):

1. each active client k downloads the global federated parameters and keeps its
   own private BN values (``u`` running mean, ``s`` running variance, ``y``
   gamma, ``b`` beta, as ``mtfl.bn_private`` says; :mod:`fedjax_kd.ops.private_bn`);
2. it trains ``train.epochs`` epochs on its data (the authors' FedAdam clients use
   plain SGD: ``train.optimizer``);
3. it uploads the federated parameters; the server forms the pseudo-gradient
   ``g = w - sum_k p_k w_k`` (``p_k = n_k / sum_S n_j``) and takes the FedAdam
   step ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
   ``w <- w - eta m / (sqrt(v) + eps)``, no bias correction (``ServerAdam``).

Choices the paper leaves open, and what is done here:

* ``eps``: not stated by FedCache 2.0; 1e-4 is the authors' README setting for
  MTFL(FedAdam).
* Federated running statistics (``bn_private`` 'yb' or 'none'): the authors'
  ``get_params`` appends them to the model, so the Adam step applies to them
  too; so here.
* The global model's private leaves are never sent and clients never read
  them. For the global-model diagnostics (``global_acc``, ``server_ua``) the
  server model holds the ``n_k``-weighted mean of the round's clients' private
  values (the authors' code runs Adam over them instead: a server-side-only
  quantity either way, not counted as traffic).
* User model accuracy (UA, the paper's metric and FedCache 2.0's): every
  client's personalised model, the current global federated parameters with its
  own private BN values, on its own test split (``data.per_client_test``),
  averaged over all K clients after the round (the authors' code scores the
  round's clients when they download, before training). Reported as
  ``test_acc`` (with ``test_acc_weighted``, ``client_acc_min/max``).

Bytes: the federated parameters (everything but the private BN leaves), one
upload per active client and one multicast download, 4 bytes each; the private
values never travel. Needs one architecture for all clients (parameter
averaging) and device-resident clients (``clients.store='device'``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms import base
from fedjax_kd.algorithms.fedavg import FedAvg, client_weights
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import param_aggregate
from fedjax_kd.ops import private_bn


@dataclasses.dataclass(frozen=True)
class MTFLOptions:
  """``mtfl.*``."""
  group: ClassVar[str] = 'mtfl'
  server_lr: float = options.option(0.01, 'FedAdam server learning rate eta (Table III)', gt=0)
  beta1: float = options.option(0.9, 'FedAdam first-moment decay (Table III)', ge=0, le=1)
  beta2: float = options.option(0.999, 'FedAdam second-moment decay (Table III)', ge=0, le=1)
  epsilon: float = options.option(1e-4, "FedAdam stabiliser (the authors' README)", gt=0)
  bn_private: str = options.option('usyb', "private BN values: u mean, s var, y gamma, b "
                                   "beta (Table III: 'usyb')", choices=private_bn.SETTINGS)

  def validate(self, spec, algorithm) -> None:
    del algorithm
    if spec.clients.store != 'device':
      raise ConfigError('clients.store', spec.clients.store,
                        "'device' for mtfl (its personalised models are formed on the device "
                        'at evaluation)')


@flax.struct.dataclass
class MTFLServer:
  """FedAdam's moments over ``{'params', 'batch_stats'}`` (leading axis 1, as the server
  model); zero on the private leaves."""
  m: Any
  v: Any


def _variables(state) -> dict:
  return {'params': state.params, 'batch_stats': state.batch_stats}


class MTFL(FedAvg):
  name = 'mtfl'
  options_class = MTFLOptions

  @functools.cached_property
  def private(self) -> dict:
    """Python bools per leaf of ``{'params', 'batch_stats'}``: True for a private BN leaf."""
    shapes = jax.eval_shape(self.server_model.init, self.ctx.root)
    return private_bn.private_mask(_variables(shapes), self.options.bn_private)

  @functools.cached_property
  def model_elements(self) -> int:
    """Floats of the federated part of one model: what one upload or download holds."""
    shapes = jax.eval_shape(self.server_model.init, self.ctx.root)
    return private_bn.shared_elements(_variables(shapes), self.private)

  @functools.cached_property
  def _broadcast(self):
    """``(cohort, server, mask) -> cohort``: rows with ``mask`` take the server's federated
    leaves and keep their private ones."""
    private = self.private

    def put(cohort, server, mask):
      def leaf(p, c, s):
        if p:
          return c
        m = mask.reshape((-1,) + (1,) * (c.ndim - 1))
        return jnp.where(m, jnp.broadcast_to(s, c.shape), c)
      v = jax.tree.map(leaf, private, _variables(cohort), _variables(server))
      return cohort.replace(params=v['params'], batch_stats=v['batch_stats'])

    return jax.jit(put)

  @functools.cached_property
  def _server_step(self):
    """``(server, extra, cohort, weights) -> (server, extra)``: FedAdam on the federated
    leaves; the private leaves of the server model become the clients' weighted mean."""
    private, o = self.private, self.options
    adam = functools.partial(private_bn.server_adam, lr=float(o.server_lr),
                             beta1=float(o.beta1), beta2=float(o.beta2),
                             eps=float(o.epsilon))

    def step(server, extra, cohort, weights):
      mean = param_aggregate.weighted_average(_variables(cohort), weights)
      w, m, v = adam(_variables(server), mean, extra.m, extra.v)
      pick = lambda new, other: jax.tree.map(lambda p, a, b: b if p else a, private, new, other)
      w = pick(w, mean)
      m, v = pick(m, extra.m), pick(v, extra.v)
      return (server.replace(params=w['params'], batch_stats=w['batch_stats']),
              MTFLServer(m=m, v=v))

    return jax.jit(step)

  def init(self):
    state = super().init()
    zeros = jax.tree.map(jnp.zeros_like, _variables(state.server))
    return state.replace(extra=MTFLServer(m=zeros, v=zeros))

  def round(self, state, r):
    if not np.any(r.active):
      return state, base.RoundOutput({'train_loss': jnp.float32(jnp.nan)}, [])
    (cohort,) = state.clients
    cohort = self._broadcast(cohort, state.server, jnp.asarray(r.active))
    state = state.replace(clients=(cohort,))
    state, loss = self.train_clients(state, r, *self.local_training(state, r))
    weights = client_weights(r, weighted=True)
    server, extra = self._server_step(state.server, state.extra, state.clients[0], weights)
    return (state.replace(server=server, extra=extra),
            base.RoundOutput({'train_loss': loss}, self.payloads(r.active)))

  def personalised(self, state) -> base.AlgState:
    """The state whose client models are every client's personalised model: the global
    federated leaves with its own private BN leaves."""
    (cohort,) = state.clients
    every = jnp.ones((cohort_size(cohort),), bool)
    return state.replace(clients=(self._broadcast(cohort, state.server, every),))

  def evaluate(self, state):
    out = self.client_metrics(self.personalised(state), prefix='')   # UA as test_acc
    g = self.server_metrics(state)
    out.update({'global_acc': g['test_acc'], 'global_loss': g['test_loss'],
                'global_acc_top5': g['test_acc_top5']})
    out.update(self.server_split_metrics(state))
    return out


def cohort_size(cohort) -> int:
  return int(jax.tree.leaves(cohort.params)[0].shape[0])
