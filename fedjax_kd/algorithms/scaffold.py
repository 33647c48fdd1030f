"""SCAFFOLD: control variates against client drift.

S. P. Karimireddy, S. Kale, M. Mohri, S. J. Reddi, S. U. Stich, A. T. Suresh,
"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
option II, as NIID-Bench runs it and FedEntOpt (Lutz et al., arXiv
2411.01240v2; spec ``fedentopt.md`` §2.8, A24) combines it with selection:

* local step: the optimizer step on ``grad f_k`` (SGD, momentum, coupled weight
  decay), then ``y <- y - lr_r (c - c_k)``. NIID-Bench applies the correction
  after ``optimizer.step()``, outside the momentum buffer; so does this code.
* after ``tau_k`` steps: ``c_k+ = c_k - c + (theta^r - y_k) / (tau_k lr_r)``.
* server: ``theta <- sum_S p_k y_k`` (``p_k = n_k / sum_S n_j``; global lr 1)
  and ``c <- c + (1 / K) sum_S (c_k+ - c_k)``.

Every client's ``c_k`` is kept (``[K, params]`` in ``AlgState.extra``) and the
control variates travel with the model both ways, so a round costs twice
FedAvg's bytes. Requires plain SGD (``train.optimizer = 'sgd'``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.ops import param_aggregate


class SCAFFOLD(FedAvg):
  name = 'scaffold'
  sgd_only = "scaffold's control-variate update assumes SGD steps"

  def init(self):
    state = super().init()
    zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)
    return state.replace(extra={'c': zeros(state.server.params),
                                'c_k': zeros(state.clients[0].params)})

  def _lr(self, t: int) -> float:
    return self.spec.train.learning_rate * self.lr_factor(t)

  def local_rule(self, state, t, active):
    del active
    # Only the slotted clients' c_k are gathered; c - c_k is formed inside the step.
    return {'control': (state.extra['c'], state.extra['c_k'], self._lr(t))}

  def after_round(self, state, start, t, active):
    c, c_k = param_aggregate.scaffold_controls(
        state.extra['c'], state.extra['c_k'], start.params, state.clients[0].params,
        jnp.asarray(active), jnp.asarray(self.local_steps(t, active)), self._lr(t),
        self.fed.population)   # N = all clients, also when a round view holds only some
    return state.replace(extra={'c': c, 'c_k': c_k})

  def client_state_keys(self):
    return ('c_k',)

  def payloads(self, active):
    # The control variates (same size as the model) go up and down with it.
    return super().payloads(active) * 2
