"""SCAFFOLD: control variates against client drift.

S. P. Karimireddy, S. Kale, M. Mohri, S. J. Reddi, S. U. Stich, A. T. Suresh,
"SCAFFOLD: Stochastic Controlled Averaging for Federated Learning", ICML 2020,
option II, as NIID-Bench runs it and FedEntOpt (Lutz et al., arXiv
2411.01240v2, §V-B4) combines it with selection, weighting clients by data size
like every other method, for a fair comparison:

* local step: the optimizer step on ``grad f_k`` (SGD, momentum, coupled weight
  decay), then ``y <- y - lr_r (c - c_k)``. NIID-Bench applies the correction
  after ``optimizer.step()``, outside the momentum buffer; so does this code.
* after ``tau_k`` steps: ``c_k+ = c_k - c + (theta^r - y_k) / (tau_k lr_r)``.
* server: ``theta <- sum_S p_k y_k`` (``p_k = n_k / sum_S n_j``; global lr 1)
  and ``c <- c + (1 / K) sum_S (c_k+ - c_k)``.

Every client's ``c_k`` is kept (``[K, params]`` in the client table) and the
control variates travel with the model both ways, so a round costs twice
FedAvg's bytes. Requires plain SGD (``train.optimizer = 'sgd'``).
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp

from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.core.program import Correction
from fedjax_kd.ops import param_aggregate


@flax.struct.dataclass
class ScaffoldTable:
  """Per client: ``c_k``, the client's control variate (the model's parameter tree)."""
  c_k: Any


@flax.struct.dataclass
class ScaffoldServer:
  """The server's control variate ``c`` (leaves with a leading axis of 1, as the server model)."""
  c: Any


def control_step(params, row, shared):
  """``y <- y - lr (c - c_k)`` after each local step, outside momentum (a
  :class:`~fedjax_kd.core.program.Correction` of the training program).

  ``row['c_k']`` is the client's variate; ``shared['c']`` the server's (leaves with a leading
  axis of 1) and ``shared['lr']`` the round's learning rate.
  """
  c, lr = shared['c'], shared['lr']
  return jax.tree.map(lambda p, cs, ck: p - (lr * (cs[0] - ck)).astype(p.dtype), params, c,
                      row['c_k'])


class SCAFFOLD(FedAvg):
  name = 'scaffold'
  sgd_only = "scaffold's control-variate update assumes SGD steps"

  def init(self):
    state = super().init()
    zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)
    return state.replace(table=ScaffoldTable(c_k=zeros(state.clients[0].params)),
                         extra=ScaffoldServer(c=zeros(state.server.params)))

  def _lr(self, t: int) -> float:
    return self.spec.train.learning_rate * self.lr_factor(t)

  def local_training(self, state, r):
    # Only the slotted clients' c_k are gathered; c - c_k is formed inside the step.
    return (self.train_program(Correction(control_step)), {'c_k': state.table.c_k},
            {'c': state.extra.c, 'lr': jnp.float32(self._lr(r.t))})

  def after_round(self, state, start, r):
    c, c_k = param_aggregate.scaffold_controls(
        state.extra.c, state.table.c_k, start.params, state.clients[0].params,
        jnp.asarray(r.active), jnp.asarray(self.local_steps(r)), self._lr(r.t),
        r.population)   # N = all K clients, also when the round holds only some
    return state.replace(table=ScaffoldTable(c_k=c_k), extra=ScaffoldServer(c=c))

  def payloads(self, active):
    # The control variates (same size as the model) go up and down with it.
    return super().payloads(active) * 2
