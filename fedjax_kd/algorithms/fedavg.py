"""FedAvg: federated learning with parameter exchange.

H. B. McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017; the "Benchmark 1: FL" of DS-FL (Itahara et
al., IEEE TMC 2021, §2.1, eqs. 1-3):
each round the active clients start from the global model ``w_0``, train
``train.epochs`` epochs, and the server sets
``w_0 = sum_k (I_k / I) w_k`` over them. Parameters *and* BatchNorm statistics
are averaged and counted as sent (A10); each client keeps its own optimizer
state (A3). Requires every client to use the same model spec.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.algorithms import base
from fedjax_kd.core.state import num_elements
from fedjax_kd.errors import ConfigError
from fedjax_kd.ops import comm


@jax.jit
def _broadcast(cohort, server, mask):
  """Sets params and batch stats of rows with ``mask`` to the server's model."""
  def put(c, s):
    m = mask.reshape((-1,) + (1,) * (c.ndim - 1))
    return jnp.where(m, jnp.broadcast_to(s, c.shape), c)
  return cohort.replace(params=jax.tree.map(put, cohort.params, server.params),
                        batch_stats=jax.tree.map(put, cohort.batch_stats, server.batch_stats))


@jax.jit
def _average(cohort, server, weights):
  """Weighted average (eq. 3) of the cohort's params and batch stats."""
  w = weights / jnp.sum(weights)
  avg = lambda c: jnp.tensordot(w, c, axes=1)[None].astype(c.dtype)
  return server.replace(params=jax.tree.map(avg, cohort.params),
                        batch_stats=jax.tree.map(avg, cohort.batch_stats))


class FedAvg(base.Algorithm):
  name = 'fedavg'
  uses_public = False
  has_server_model = True

  @classmethod
  def options_from_config(cls, config, spec):
    if len(set(spec.client_models)) != 1:
      raise ConfigError('clients.models', list(dict.fromkeys(spec.client_models)),
                        'a single model spec for fedavg (parameter averaging needs '
                        'identical architectures)')
    return None

  def __init__(self, ctx):
    # The global model has the clients' architecture whatever server.model says.
    ctx = dataclasses.replace(ctx, spec=dataclasses.replace(
        ctx.spec, server_model=ctx.spec.client_models[0]))
    super().__init__(ctx)

  def _model_elements(self, state) -> int:
    return num_elements(state.server.params) + num_elements(state.server.batch_stats)

  def setup_payloads(self):
    # The initial global model is broadcast once (DS-FL §5: 1 + r(K+1) models).
    n = getattr(self, '_elements', None)
    if n is None:
      return []
    return [comm.Payload('params', comm.DOWN, 'float', n, self.fed.num_clients,
                         multicast=True)]

  def init(self):
    state = super().init()
    self._elements = self._model_elements(state)
    return state

  def round(self, state, t, active):
    (cohort,) = state.clients
    mask = jnp.asarray(active)
    cohort = _broadcast(cohort, state.server, mask)
    state = state.replace(clients=(cohort,))
    state, loss = self.train_clients(state, t, active)
    weights = jnp.asarray(self.ctx.data.client_n * active, jnp.float32)
    server = _average(state.clients[0], state.server, weights)
    state = state.replace(server=server)
    payloads = comm.model_exchange(int(np.sum(active)), self._elements)
    return state, base.RoundOutput({'train_loss': loss}, payloads)

  def evaluate(self, state):
    out = self.server_metrics(state)
    out.update(self.client_metrics(state))
    return out
