"""FedLC: FedAvg whose local loss calibrates the logits by the client's label counts.

J. Zhang, Z. Li, B. Li, J. Xu, S. Wu, S. Ding, C. Wu, "Federated Learning with Label
Distribution Skew via Logits Calibration", ICML 2022 (PMLR 162, pp. 26311-26329). Client k
trains on the calibrated cross-entropy (the paper's pairwise label margin)

  ``L = -log( exp(f_y(x) - tau n_{k,y}^{-1/4}) / sum_c exp(f_c(x) - tau n_{k,c}^{-1/4}) )``

with ``n_{k,c}`` its number of samples of class c: a rare local class gets a larger margin
``tau n^{-1/4}``, so the local model is pushed less towards its frequent classes.
Aggregation, the global model and the test-time prediction are FedAvg's; the bytes are
FedAvg's (:func:`fedjax_kd.ops.comm.model_exchange`): the counts never leave the client.

``fedlc.tau`` defaults to 1, the value FedEntOpt (Lutz et al., arXiv 2411.01240v2, §V-A)
uses.

What the paper leaves open, and the choices here:

* Classes the client has no sample of (``n_{k,c} = 0``): ``n^{-1/4}`` is infinite, so
  their calibrated logits are ``-inf`` and they leave the softmax: the local loss is the
  cross-entropy over the client's own classes only (the limit of the formula, and what
  the public implementations compute: FL-bench's and fluke's ``0 ** -0.25 = inf``). Done
  exactly with a masked log-sum-exp (:func:`fedjax_kd.ops.label_skew.calibrated_cross_entropy`),
  with no infinities in the program.
* The denominator runs over every (present) class including ``y``: the standard softmax
  of the logit-adjusted loss the paper builds on and of the public implementations; a sum
  over ``c != y`` alone would make the loss unbounded below.
* ``n_{k,c}`` are raw counts (not frequencies), of the rows the client trains on
  (``FederatedData.client_idx``, after any validation hold-out), fixed for the run.

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


def fedlc_loss(logits, batch, row):
  """The calibrated cross-entropy with the client's ``row['margin']``, ``row['present']``."""
  return label_skew.calibrated_cross_entropy(logits, batch['y'], row['margin'],
                                             row['present'])


@dataclasses.dataclass(frozen=True)
class FedLCOptions:
  """``fedlc.*``."""
  group: ClassVar[str] = 'fedlc'
  tau: float = options.option(1.0, "the calibration strength: margin tau n_c^(-1/4) "
                              "(FedEntOpt's value)", ge=0)


class FedLC(FedAvg):
  name = 'fedlc'
  options_class = FedLCOptions

  @functools.cached_property
  def client_margins(self) -> tuple[np.ndarray, np.ndarray]:
    """``([K, C] margins, [K, C] present)`` of every client (fixed for the run)."""
    return label_skew.fedlc_margins(self.ctx.data.client_labels(), self.options.tau)

  def local_training(self, state, r):
    """FedAvg's local training with the calibrated loss (the round's clients' counts)."""
    del state
    margin, present = self.client_margins
    return (self.train_program(loss=fedlc_loss),
            {'margin': jnp.asarray(margin[r.ids]), 'present': jnp.asarray(present[r.ids])},
            None)
