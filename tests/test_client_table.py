"""The client table: a per-client array is one declaration, wherever clients live.

The worked example of ``docs/design.md`` ("Adding a per-client array") is
:class:`Weighted`: local training where each client's loss is scaled by its
own weight, and a count of the rounds each client has taken part in. Its two
per-client arrays are the fields of one table dataclass; nothing else is
declared, and the host store with partial participation gives the same result
as device-resident clients. :class:`Forgetful` keeps the same weights in
server-side state instead: it is refused loudly on the first round that sees
only some clients, where the old engine would have given clients other
clients' rows.
"""

from __future__ import annotations

from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd import algorithms
from fedjax_kd import config as config_lib
from fedjax_kd.algorithms import base
from fedjax_kd.core import program
from fedjax_kd.running import experiment
from tests.shared import tiny_config


def weighted_ce(logits, batch, row):
  """Cross-entropy times the client's weight ``row['w']`` (a module-level function: part of
  the training program's hash)."""
  return row['w'] * program.ce_loss(logits, batch, row)


@flax.struct.dataclass
class WeightedTable:
  weight: Any   # [K] float32, the client's loss weight
  rounds: Any   # [K] int32, rounds the client has taken part in


class Weighted(base.Algorithm):
  """Each client trains on its own data with its own loss weight; no exchange."""
  name = 'weighted'
  uses_public = False

  def init(self):
    state = super().init()
    k = self.num_clients
    weight = jnp.linspace(0.5, 1.5, k, dtype=jnp.float32)
    return state.replace(table=WeightedTable(weight=weight, rounds=jnp.zeros(k, jnp.int32)))

  def round(self, state, r):
    state, loss = self.weighted_training(state, r, state.table.weight)
    table = state.table.replace(rounds=state.table.rounds + jnp.asarray(r.active, jnp.int32))
    return state.replace(table=table), base.RoundOutput({'train_loss': loss}, [])

  def weighted_training(self, state, r, weight):
    return self.train_clients(state, r, self.train_program(loss=weighted_ce), row={'w': weight})


@flax.struct.dataclass
class ForgetfulServer:
  weight: Any   # [K]: per-client, but kept on the server side


class Forgetful(Weighted):
  """The same weights, forgotten in the server state."""
  name = 'forgetful'

  def init(self):
    state = base.Algorithm.init(self)
    weight = jnp.linspace(0.5, 1.5, self.num_clients, dtype=jnp.float32)
    return state.replace(extra=ForgetfulServer(weight=weight))

  def round(self, state, r):
    state, loss = self.weighted_training(state, r, state.extra.weight)
    return state, base.RoundOutput({'train_loss': loss}, [])


@pytest.fixture
def registered(monkeypatch):
  monkeypatch.setitem(algorithms.ALGORITHMS, 'weighted', Weighted)
  monkeypatch.setitem(algorithms.ALGORITHMS, 'forgetful', Forgetful)


def _build(name, store):
  c = tiny_config('single', rounds=3)
  c.algorithm = name
  c.clients.num_clients = 8
  c.clients.participation = 0.5
  c.clients.store = store
  return experiment.build(config_lib.validate(c))


def _play(exp, rounds=3):
  algo = exp.algorithm
  state = base.init_state(algo)
  masks = []
  for t in range(1, rounds + 1):
    active = exp.ctx.selector.plan(t).active
    masks.append(active)
    state, _ = base.play_round(algo, state, t, active)
  return state, np.asarray(masks)


@pytest.mark.slow
def test_a_declared_table_gives_the_same_run_on_device_and_host(registered):
  del registered
  dev, masks = _play(_build('weighted', 'device'))
  host, host_masks = _play(_build('weighted', 'host'))
  np.testing.assert_array_equal(masks, host_masks)
  assert 0 < masks.sum(1).max() < 8           # partial participation
  np.testing.assert_array_equal(np.asarray(host.table.rounds), masks.sum(0))
  np.testing.assert_array_equal(np.asarray(dev.table.rounds), masks.sum(0))
  np.testing.assert_array_equal(np.asarray(host.table.weight), np.asarray(dev.table.weight))
  assert isinstance(host.table.rounds, np.ndarray)      # it lives in the store
  for a, b in zip(jax.tree.leaves(host.clients), jax.tree.leaves(dev.clients)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_forgotten_declaration_is_refused_on_the_first_partial_round(registered):
  del registered
  _play(_build('forgetful', 'device'))       # all K rows present: nothing to refuse
  with pytest.raises(ValueError, match=r"row\['w'\] has shape \(8,\), but this round has "
                     r"\d clients \(of 8\).*client table"):
    _play(_build('forgetful', 'host'))


def test_a_table_field_without_a_row_per_client_is_refused_at_init():
  with pytest.raises(ValueError, match=r'client table field \.rounds has shape \(3,\).*K=8'):
    base.check_table(WeightedTable(weight=np.zeros(8), rounds=np.zeros(3)), 8)
  base.check_table(WeightedTable(weight=np.zeros(8), rounds=np.zeros((8, 2))), 8)
  base.check_table((), 8)
