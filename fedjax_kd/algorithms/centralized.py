"""Centralized reference: one model trained on the union of the private data.

The upper reference line of SCARLET (Azuma et al., 2025, Table IV: SGD with
lr 0.01, batch 100; the paper gives no epoch count): each "round" is
``train.epochs`` epochs over all clients' private data pooled; the evaluated
model is that one model on the server test set. There is no communication.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from fedjax_kd.algorithms import base
from fedjax_kd.core import rng
from fedjax_kd.core.program import Rows


class Centralized(base.Algorithm):
  name = 'centralized'
  uses_public = False
  has_server_model = True

  def init(self):
    return base.AlgState(clients=(), server=self.server_model.init(
        rng.server_key(self.ctx.root, 0, 'init')))

  def program(self):
    """Training on the pooled private data: ``train.*``, its optimizer state kept from round
    to round (one model's long run, whatever ``train.fresh_optimizer`` says)."""
    return dataclasses.replace(self.train_program(), fresh=False)

  def pooled(self) -> Rows:
    d = self.ctx.data
    m = int(d.x_private.shape[0])
    return Rows({'x': d.x_private, 'y': d.y_private}, jnp.arange(m, dtype=jnp.int32), m)

  def programs(self, shapes):
    del shapes
    return (base.planned(self.program(), self.pooled(), None, self.training_shared(1),
                         server=True),)

  def round(self, state, r):
    t = r.t
    ran = self.server_model.run(self.program(), state.server,
                                rng.server_key(self.ctx.root, t, 'train'), data=self.pooled(),
                                shared=self.training_shared(t))
    return state.replace(server=ran.states), base.RoundOutput({'train_loss': ran.metrics}, [])

  def evaluate(self, state):
    return self.server_metrics(state)
