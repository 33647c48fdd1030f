"""DS-FL: distillation-based semi-supervised FL with SA or ERA aggregation.

S. Itahara, T. Nishio, Y. Koda, M. Morikura, K. Yamamoto, "Distillation-Based
Semi-Supervised Federated Learning for Communication-Efficient Collaborative
Training With Non-IID Private Data", IEEE TMC 2021 (Algorithm 1).

One round (spec ``dsfl.md`` §2.3):
  1. every client runs ``train.epochs`` epochs on its private data, starting
     from its own persistent model (A1);
  2. the server draws ``o_r`` (``distill.public_per_round`` open samples,
     uniform without replacement, A6) and every client predicts on it;
  3-4. the server averages the uploaded probabilities (SA, eq. 16) and, for
     ERA, applies ``softmax(mean / T)`` (eq. 13);
  5-6. clients and the server's global model ``w_g`` distil on ``(D^{or}, T)``
     for ``distill.epochs`` epochs (eqs. 10, 11). ``w_g`` is the evaluated model.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from fedjax_kd.algorithms import base
from fedjax_kd.config import _choice, _float
from fedjax_kd.ops import aggregate, comm


@dataclasses.dataclass(frozen=True)
class DSFLOptions:
  aggregation: str   # 'sa' | 'era'
  temperature: float


class DSFL(base.Algorithm):
  """DS-FL with SA or ERA; the server model is distilled and evaluated."""
  name = 'dsfl'
  paper_rules = 'dsfl'
  uses_public = True
  has_server_model = True

  @classmethod
  def options_from_config(cls, config, spec) -> DSFLOptions:
    return DSFLOptions(aggregation=_choice(config, 'dsfl.aggregation', aggregate.AGGREGATIONS),
                       temperature=_float(config, 'dsfl.temperature', 0.0, lo_open=True))

  def round(self, state, t, active):
    state, train_loss = self.train_clients(state, t, active)
    _, x = self.sample_public(t)
    probs = self.fed.predict(state.clients, x, active, chunk=self.spec.eval_chunk)
    weights = jnp.asarray(active, jnp.float32)
    mean = aggregate.mean_aggregate(probs, weights)
    targets = (aggregate.era(mean, self.options.temperature)
               if self.options.aggregation == 'era' else mean)
    state, distill_loss = self.distill_clients(state, t, x, targets, active)
    state, server_loss = self.distill_server(state, t, x, targets)
    metrics = {'train_loss': train_loss, 'distill_loss': distill_loss,
               'server_distill_loss': server_loss,
               'entropy': float(aggregate.mean_entropy(targets)),
               'sa_entropy': float(aggregate.mean_entropy(mean))}
    payloads = comm.soft_label_exchange(int(np.sum(active)), int(x.shape[0]),
                                        self.ctx.data.num_classes)
    return state, base.RoundOutput(metrics, payloads)

  def evaluate(self, state):
    out = self.server_metrics(state)
    out.update(self.client_metrics(state))
    return out
