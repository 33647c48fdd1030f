"""Local-training rules of the engine and the parameter-exchange aggregation ops.

Per-client epoch budgets (stragglers), a per-round learning-rate factor, fresh
optimizer state, FedProx's proximal term and SCAFFOLD's post-step correction, each
checked against a hand-written update; FedNova and SCAFFOLD server math on
numbers worked out by hand.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd.algorithms.fedprox import ProximalTerm
from fedjax_kd.algorithms.scaffold import control_step
from fedjax_kd.core.program import Correction
from fedjax_kd.ops import losses
from fedjax_kd.ops import param_aggregate as pa
from tests.shared import train
from tests.test_engine import TinyMLP, assert_trees_close, make_data, make_fed, params_of

ROOT = jax.random.PRNGKey(0)
SIZES = [9, 14, 20]


def _train(tx=None, *, epochs, batch_size, epochs_k=None, lr_scale=1.0):
  data = make_data(SIZES)
  fed = make_fed(data, tx=tx)
  st = fed.init(ROOT)
  st, _ = train(fed, st, ROOT, 1, epochs, batch_size, epochs_k=epochs_k, lr_scale=lr_scale,
                active=np.ones(3, bool))
  return fed, data, st


@pytest.mark.slow
def test_epoch_budget_equals_a_shorter_run():
  """epochs_k = 1 of 3 gives exactly what a 1-epoch run gives (stragglers)."""
  _, _, short = _train(epochs=1, batch_size=4)
  fed, _, mixed = _train(epochs=3, batch_size=4, epochs_k=np.array([1, 3, 2]))
  _, _, full = _train(epochs=3, batch_size=4)
  fed1, _, _ = _train(epochs=1, batch_size=4)
  assert_trees_close(params_of(fed, mixed, 0), params_of(fed1, short, 0), rtol=1e-6)
  assert_trees_close(params_of(fed, mixed, 1), params_of(fed, full, 1), rtol=1e-6)
  a = params_of(fed, mixed, 2)['Dense_0']['kernel']
  assert not np.allclose(a, params_of(fed, full, 2)['Dense_0']['kernel'])


@pytest.mark.parametrize('momentum,wd', [(0.0, 0.0), (0.9, 5e-4)])
@pytest.mark.slow
def test_lr_scale_is_a_learning_rate_factor(momentum, wd):
  def tx(lr):
    t = optax.sgd(lr, momentum=momentum or None)
    return optax.chain(optax.add_decayed_weights(wd), t) if wd else t
  fed, _, a = _train(tx=tx(0.1), epochs=2, batch_size=4, lr_scale=0.5)
  _, _, b = _train(tx=tx(0.05), epochs=2, batch_size=4)
  for k in range(3):
    assert_trees_close(params_of(fed, a, k), params_of(fed, b, k), rtol=2e-5, atol=1e-7)


@pytest.mark.slow
def test_fresh_optimizer_resets_momentum():
  tx = optax.sgd(0.1, momentum=0.9)
  data = make_data(SIZES)
  fed = make_fed(data, tx=tx)
  st = fed.init(ROOT)
  st, _ = train(fed, st, ROOT, 1, 1, 4)
  copy = lambda: jax.tree.map(jnp.array, st[0])   # training donates its input
  reset = copy()
  reset = reset.replace(opt_state={'train': jax.vmap(tx.init)(reset.params)})
  a, _ = train(fed, (copy(),), ROOT, 2, 1, 4, fresh=True)
  b, _ = train(fed, (reset,), ROOT, 2, 1, 4)
  c, _ = train(fed, (copy(),), ROOT, 2, 1, 4)
  assert_trees_close(a[0].params, b[0].params, rtol=1e-6)
  assert not np.allclose(a[0].params['Dense_0']['kernel'], c[0].params['Dense_0']['kernel'])


@pytest.mark.parametrize('mu,shift_value', [(0.5, 0.0), (0.0, 0.01), (0.5, 0.01)])
@pytest.mark.slow
def test_prox_and_shift_match_a_hand_written_update(mu, shift_value):
  """Two full-batch SGD steps: p <- p - lr (g(p) + mu (p - p0)) - s."""
  lr = 0.1
  data = make_data(SIZES)
  fed = make_fed(data, tx=optax.sgd(lr))
  st0 = fed.init(ROOT)
  p0 = params_of(fed, st0, 1)
  # SCAFFOLD's control with c - c_k = shift_value / lr everywhere (c = 0.5 + that, c_k = 0.5).
  c_k = jax.tree.map(lambda a: jnp.full(a.shape, 0.5, a.dtype), st0[0].params)
  c = jax.tree.map(lambda a: a[:1] + shift_value / lr, c_k)
  # FedProx's and SCAFFOLD's own transforms, as their algorithms chain them.
  transforms = ([ProximalTerm(mu)] if mu else []) + [Correction(control_step)]
  st, _ = train(fed, st0, ROOT, 1, 2, 64, transforms=transforms, row={'c_k': c_k},
                shared={'c': c, 'lr': jnp.float32(lr)})

  n = int(data.client_n[1])
  rows = np.asarray(data.client_idx)[1, :n]
  x, y = np.asarray(data.x_private)[rows], np.asarray(data.y_private)[rows]
  module = TinyMLP(8)
  g = jax.grad(lambda p: jnp.mean(losses.cross_entropy(module.apply({'params': p}, x), y)))
  p = p0
  for _ in range(2):
    grad = g(p)
    p = jax.tree.map(lambda a, gr, a0: a - lr * (gr + mu * (a - a0)) - shift_value, p, grad, p0)
  assert_trees_close(params_of(fed, st, 1), p, rtol=1e-5, atol=1e-6)


def test_weighted_average_by_hand():
  stacked = {'w': jnp.array([[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]])}
  out = pa.weighted_average(stacked, jnp.array([1.0, 3.0, 0.0]))
  np.testing.assert_allclose(out['w'], [[2.5, 5.0]])


def test_fednova_by_hand():
  start = {'w': jnp.array([[1.0]])}
  stacked = {'w': jnp.array([[0.5], [0.2], [9.0]])}
  weights = jnp.array([1.0, 1.0, 0.0])
  # rho = 0: a = tau = (2, 4); d = (0.25, 0.2); tau_eff = 3 -> 1 - 3 * 0.225 = 0.325.
  out = pa.fednova_average(start, stacked, weights, jnp.array([2.0, 4.0, 0.0]), rho=0.0)
  np.testing.assert_allclose(out['w'], [[0.325]], rtol=1e-6)
  # Equal tau reduces to FedAvg's mean (0.35).
  out = pa.fednova_average(start, stacked, weights, jnp.array([3.0, 3.0, 0.0]), rho=0.0)
  np.testing.assert_allclose(out['w'], [[0.35]], rtol=1e-6)
  # rho = 0.5: a(1) = 1, a(2) = (2 - 0.5 * 0.75 / 0.5) / 0.5 = 2.5.
  np.testing.assert_allclose(pa.fednova_coefficient(jnp.array([1.0, 2.0]), 0.5), [1.0, 2.5])
  # d = (0.5 / 1, 0.8 / 2.5) = (0.5, 0.32); tau_eff = 1.75 -> 1 - 1.75 * 0.41 = 0.2825.
  out = pa.fednova_average(start, {'w': jnp.array([[0.5], [0.2], [0.0]])}, weights,
                           jnp.array([1.0, 2.0, 0.0]), rho=0.5)
  np.testing.assert_allclose(out['w'], [[0.2825]], rtol=1e-6)


def test_scaffold_controls_by_hand():
  c = {'w': jnp.array([[0.1]])}
  c_k = {'w': jnp.array([[0.0], [0.2], [0.7], [0.3]])}
  start = {'w': jnp.array([[1.0]])}
  y = {'w': jnp.array([[0.5], [0.8], [0.0], [0.0]])}
  trained = jnp.array([True, True, False, False])
  tau = jnp.array([5.0, 2.0, 0.0, 0.0])
  c_new, ck_new = pa.scaffold_controls(c, c_k, start, y, trained, tau, 0.1, 4)
  # c1+ = 0 - 0.1 + 0.5 / 0.5 = 0.9; c2+ = 0.2 - 0.1 + 0.2 / 0.2 = 1.1; others kept.
  np.testing.assert_allclose(ck_new['w'][:, 0], [0.9, 1.1, 0.7, 0.3], rtol=1e-6)
  # c = 0.1 + ((0.9 - 0) + (1.1 - 0.2)) / 4 = 0.55.
  np.testing.assert_allclose(c_new['w'], [[0.55]], rtol=1e-6)
