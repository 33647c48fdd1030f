"""FedNova: normalised averaging against objective inconsistency.

J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, "Tackling the Objective
Inconsistency Problem in Heterogeneous Federated Optimization", NeurIPS 2020,
in NIID-Bench's form for SGD with momentum ``rho = train.momentum``
(as FedEntOpt, Lutz et al., arXiv 2411.01240v2, §V-B4, runs it):
``tau_k`` is the number of local steps client k actually ran
(``epochs_k * ceil(n_k / batch)``, stragglers included),
``a_k = [tau_k - rho (1 - rho^tau_k) / (1 - rho)] / (1 - rho)`` and the server
sets ``theta <- theta - (sum_k p_k a_k) sum_k p_k (theta - theta_k) / a_k`` with
``p_k = n_k / sum_S n_j``. BatchNorm statistics, if any, are averaged as in
FedAvg. ``a_k`` assumes a momentum buffer that starts at zero each round, so
pair it with ``train.fresh_optimizer = True`` (the FedEntOpt configs do).
"""

from __future__ import annotations

import jax.numpy as jnp

from fedjax_kd.algorithms.fedavg import FedAvg, client_weights
from fedjax_kd.ops import param_aggregate


class FedNova(FedAvg):
  name = 'fednova'
  sgd_only = "fednova's a_k is derived for SGD with momentum"

  def aggregate(self, state, start, r):
    server = super().aggregate(state, start, r)   # batch stats: plain mean
    weights = client_weights(r, weighted=True)
    params = param_aggregate.fednova_average(
        start.params, state.clients[0].params, weights,
        jnp.asarray(self.local_steps(r)), float(self.spec.train.momentum))
    return server.replace(params=params)
