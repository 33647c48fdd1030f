"""DS-FL: distillation-based semi-supervised FL with SA or ERA aggregation.

S. Itahara, T. Nishio, Y. Koda, M. Morikura, K. Yamamoto, "Distillation-Based
Semi-Supervised Federated Learning for Communication-Efficient Collaborative
Training With Non-IID Private Data", IEEE TMC 2021 (Algorithm 1).

One round (the paper's §2.3.2), on the shared round engine
(:mod:`fedjax_kd.algorithms.protocol`):
  1. every client runs ``train.epochs`` epochs on its private data, starting
     from its own persistent model (DS-FL broadcasts no parameters, so the
     update of eq. 1 starts from the client's model after its last distillation);
  2. the server draws ``o_r`` (``distill.public_per_round`` open samples,
     uniform without replacement, redrawn every round) and every client predicts
     on it;
  3-4. the server averages the uploaded probabilities (SA, eq. 16) and, for
     ERA, applies ``softmax(mean / T)`` (eq. 13);
  5-6. clients and the server's global model ``w_g`` distil on ``(D^{or}, T)``
     for ``distill.epochs`` epochs (eqs. 10, 11). ``w_g`` is the evaluated model.

``dsfl.schedule='same_round'`` (default) is the paper's order; ``'next_round'``
is the order of SCARLET's code, where DS-FL is a baseline: clients distil on
round t's labels at the start of round t+1, and client accuracy is measured
after local training.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp

from fedjax_kd import fields
from fedjax_kd import options
from fedjax_kd.algorithms import protocol
from fedjax_kd.ops import aggregate


@dataclasses.dataclass(frozen=True)
class DSFLOptions:
  """``dsfl.*``."""
  group: ClassVar[str] = 'dsfl'
  aggregation: str = options.option('era', "'sa' averages the uploads; 'era' sharpens the "
                                    'average at the temperature', choices=aggregate.AGGREGATIONS)
  temperature: float = options.option(0.1, 'ERA temperature T', ge=fields.MIN_TEMPERATURE)
  schedule: str = options.option('same_round', "'same_round' (the paper) or 'next_round' "
                                 "(SCARLET's code: labels sent at the start of the next round)",
                                 choices=protocol.SCHEDULES)
  cache: protocol.CacheOptions = options.nested(protocol.CacheOptions)


class DSFL(protocol.Protocol):
  """DS-FL with SA or ERA; the server model is distilled and evaluated."""
  name = 'dsfl'
  options_class = DSFLOptions
  paper_rules = 'dsfl'

  @property
  def schedule(self) -> str:
    return self.options.schedule

  def aggregate(self, probs, mask):
    mean, count = aggregate.uploader_mean(probs, mask)
    labels = (aggregate.era(mean, self.options.temperature)
              if self.options.aggregation == 'era' else mean)
    keep = count > 0
    sa_entropy = jnp.sum(aggregate.entropy(mean) * keep) / jnp.maximum(jnp.sum(keep), 1)
    return labels, keep, {'sa_entropy': sa_entropy}
