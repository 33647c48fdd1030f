"""FedRS: FedAvg whose local loss restricts the softmax of classes a client has no sample of.

X.-C. Li, D.-C. Zhan, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data", KDD 2021 (pp. 995-1005). Client k trains on the restricted
softmax

  ``L = -log( exp(s_{k,y} o_y) / sum_c exp(s_{k,c} o_c) )``,  ``o = f(x)`` the logits,

with ``s_{k,c} = 1`` for a class k has samples of and ``alpha`` for a missing class, so
the missing classes' logits (and the updates of their classifier rows, which a client
cannot see positive examples of) are damped; ``y`` is always present, so only the
softmax's denominator changes. Aggregation, the global model and the test-time
prediction are FedAvg's (the scaling is a local-training device only); the bytes are
FedAvg's (:func:`fedjax_kd.ops.comm.model_exchange`): the class-presence vector never
leaves the client.

``fedrs.alpha`` defaults to 0.5, the value FedEntOpt (Lutz et al., arXiv 2411.01240v2,
§V-A) adopts "as recommended by the authors".

What the paper leaves open, and the choices here:

* Where alpha multiplies: the paper writes the logit as ``w_c^T h`` (no bias); the
  authors' code (FedRepo, ``algorithms/fedrs.py``) multiplies the bias-free product
  ``h W^T`` by the scales. Our models end in a biased Dense layer, and the scales
  multiply its whole output ``W h + b`` (the logits the model returns); the loss sees no
  other difference.
* Which scales: the paper's binary ``1 / alpha`` (default). The authors' code scales
  by ``alpha + (1 - alpha) n_{k,c} / max_c n_{k,c}`` (also damping rare present classes);
  ``fedrs.proportional=True`` selects it.
* The authors' code clips the gradient norm for every algorithm alike; this is not part
  of FedRS and is not done here (as for our other FedAvg-family baselines).
* A client's label counts are those of the rows it trains on (``FederatedData.client_idx``,
  after any validation hold-out).

Parameter averaging: every client needs the same model spec (``clients.models``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from fedjax_kd import options
from fedjax_kd.algorithms.fedavg import FedAvg
from fedjax_kd.ops import label_skew


def fedrs_loss(logits, batch, row):
  """The restricted-softmax cross-entropy with the client's scales ``row['scale']`` ``[C]``."""
  return label_skew.restricted_cross_entropy(logits, batch['y'], row['scale'])


@dataclasses.dataclass(frozen=True)
class FedRSOptions:
  """``fedrs.*``."""
  group: ClassVar[str] = 'fedrs'
  alpha: float = options.option(0.5, "the logit scale of a class the client has no sample "
                                "of (FedEntOpt's and the authors' value)", ge=0, le=1)
  proportional: bool = options.option(False, "the authors' code's scales alpha + (1 - alpha) "
                                      'n_c / max n (default: the paper\'s 1 or alpha)')


class FedRS(FedAvg):
  name = 'fedrs'
  options_class = FedRSOptions

  @functools.cached_property
  def client_scales(self) -> np.ndarray:
    """``[K, C]`` every client's logit scales (fixed for the run: from its label counts)."""
    return label_skew.fedrs_scales(self.ctx.data.client_labels(), self.options.alpha,
                                   self.options.proportional)

  def local_training(self, state, r):
    """FedAvg's local training with the restricted softmax (the round's clients' scales)."""
    del state
    return (self.train_program(loss=fedrs_loss),
            {'scale': jnp.asarray(self.client_scales[r.ids])}, None)
