"""FedProx: FedAvg with a proximal term in the local objective.

T. Li, A. K. Sahu, M. Zaheer, M. Sanjabi, A. Talwalkar, V. Smith, "Federated
Optimization in Heterogeneous Networks", MLSys 2020. Each active client
minimises ``F_k(w) + (mu / 2) ||w - theta^r||^2`` from the global model
``theta^r``; the server averages as FedAvg. ``fedprox.mu`` defaults to 1e-4,
the value FedEntOpt (Lutz et al., arXiv 2411.01240v2, §V-A) tuned over
{1e-4, 1e-3, 1e-2}. The term is added to the mean minibatch loss (as
NIID-Bench does), so coupled weight decay still applies to the gradient.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from fedjax_kd import options
from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.core.program import Transform, tree_sq_distance


@dataclasses.dataclass(frozen=True)
class ProximalTerm(Transform):
  """``(mu / 2) ||w - theta^r||^2``, added to the local loss (a transform chained onto the
  training program; hashable: equal mu, one compile)."""
  mu: float

  def penalty(self, params, start, row, shared):
    del row, shared
    return 0.5 * self.mu * tree_sq_distance(params, start)


@dataclasses.dataclass(frozen=True)
class FedProxOptions:
  """``fedprox.*``."""
  group: ClassVar[str] = 'fedprox'
  mu: float = options.option(1e-4, "the proximal weight (FedEntOpt's tuned value)", ge=0)


class FedProx(FedAvg):
  name = 'fedprox'
  options_class = FedProxOptions

  def local_training(self, state, r):
    del state, r
    mu = self.options.mu
    return self.train_program(*([ProximalTerm(mu)] if mu else [])), None, None
