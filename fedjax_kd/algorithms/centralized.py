"""Centralized reference: one model trained on the union of the private data.

The upper reference line of SCARLET (Azuma et al., 2025, Table IV: SGD with
lr 0.01, batch 100; the paper gives no epoch count): each "round" is
``train.epochs`` epochs over all clients' private data pooled; the evaluated
model is that one model on the server test set. There is no communication.
"""

from __future__ import annotations

from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.local import Local, LocalRule


class Centralized(base.Algorithm):
  name = 'centralized'
  uses_public = False
  has_server_model = True

  def init(self):
    return base.AlgState(clients=(), server=self.server_model.init(
        rng.server_key(self.ctx.root, 0, 'init')))

  def round(self, state, r):
    t = r.t
    d = self.ctx.data
    tr = self.spec.train
    rule = LocalRule(epochs=tr.epochs, batch_size=tr.batch_size, augment=self.augment)
    server, loss = self.server_model.fit(state.server, rng.server_key(self.ctx.root, t, 'train'),
                                         d.x_private, d.y_private, rule,
                                         Local(lr_scale=self.lr_factor(t)))
    return state.replace(server=server), base.RoundOutput({'train_loss': loss[0]}, [])

  def evaluate(self, state):
    return self.server_metrics(state)
