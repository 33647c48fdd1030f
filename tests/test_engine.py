"""The vmapped client engine: padding, participation, determinism, compiles."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_kd.core.federation import Federation
from fedjax_kd.data.federated import build_federated_data, pack_indices
from tests.shared import distill, train


class TinyMLP(nn.Module):
  """Minimal model following the engine's model contract (mask for BatchNorm)."""
  width: int = 8
  bn: bool = False

  @nn.compact
  def __call__(self, x, train=False, mask=None, embed=False):
    x = x.reshape(x.shape[0], -1)
    x = nn.Dense(self.width)(x)
    if self.bn:
      m = None if mask is None else jnp.broadcast_to(mask[:, None], x.shape)
      x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x, mask=m)
    x = nn.relu(x)
    return x if embed else nn.Dense(3)(x)


def make_data(sizes, seed=0):
  rs = np.random.RandomState(seed)
  n = int(sum(sizes))
  pool = 400
  x = rs.randn(pool, 4).astype(np.float32)
  y = rs.randint(0, 3, pool)
  x = np.concatenate([x[:n], x[-50:]])
  y = np.concatenate([y[:n], y[-50:]])
  starts = np.cumsum([0] + list(sizes))
  idx = [np.arange(starts[k], starts[k + 1]) for k in range(len(sizes))]
  return build_federated_data(x[:n], y[:n], idx, x[n:], x[n:], y[n:], 3)


def make_fed(data, models=None, bn=False, tx=None):
  k = data.num_clients
  models = models or ['a'] * k
  modules = {'a': TinyMLP(8, bn), 'b': TinyMLP(16, bn)}
  return Federation(data, models, {m: modules[m] for m in set(models)},
                    {'train': tx or optax.sgd(0.1)}, use_mesh=False)


def params_of(fed, states, client):
  c = next(i for i, co in enumerate(fed.cohorts) if client in co.client_ids)
  row = int(np.flatnonzero(fed.cohorts[c].client_ids == client)[0])
  return jax.tree.map(lambda a: np.asarray(a[row]), states[c].params)


def assert_trees_close(a, b, **kw):
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, **kw), a, b)


def test_pack_indices_pads_and_counts():
  table, n = pack_indices([np.array([3, 4]), np.array([7]), np.array([], int)])
  np.testing.assert_array_equal(n, [2, 1, 0])
  np.testing.assert_array_equal(table, [[3, 4], [7, 0], [0, 0]])


@pytest.mark.slow
def test_result_does_not_depend_on_other_clients_padding():
  """Client 0 (23 samples) trains identically beside a 23- or a 61-sample client."""
  root = jax.random.PRNGKey(1)
  results = []
  for other in (23, 61):
    data = make_data([23, other])
    fed = make_fed(data)
    states, _ = train(fed, fed.init(root), root, 1, 3, 5)
    results.append(params_of(fed, states, 0))
  assert_trees_close(results[0], results[1], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_epoch_positions_visit_real_samples_in_the_same_batches_whatever_the_padding():
  """A client's batches of real samples are the same at any padded length (the PyTorch
  lock-step reference pads every client to one length and relies on it)."""
  from fedjax_kd.core.program import epoch_positions  # pylint: disable=g-import-not-at-top
  key = jax.random.PRNGKey(4)
  batches = []
  for n_max in (23, 24, 61):
    pos, _ = epoch_positions(key, n_max, jnp.int32(23), 3, 5)
    pos = np.asarray(pos)
    batches.append([tuple(p[p < 23]) for p in pos if (p < 23).any()])
  assert batches[0] == batches[1] == batches[2]
  assert len(batches[0]) == 3 * 5   # 3 epochs of ceil(23 / 5) batches, the last of 3 samples
  assert sorted(sum(map(list, batches[0][:5]), [])) == list(range(23))


def test_keras_step_count_and_no_update_without_data():
  """ceil(n/B) steps per epoch; a client with no data is never updated."""
  data = make_data([7, 0])
  fed = make_fed(data, tx=optax.sgd(0.0))  # lr 0: only the optimizer's step counter moves
  root = jax.random.PRNGKey(0)
  fed2 = make_fed(data, tx=optax.adam(1e-3))
  s0 = fed2.init(root)
  s1, loss = train(fed2, s0, root, 1, 2, 3)
  count = np.asarray(s1[0].opt_state['train'][0].count)
  np.testing.assert_array_equal(count, [2 * 3, 0])  # ceil(7/3)=3 steps x 2 epochs; none
  assert np.isnan(loss[1]) or loss[1] == 0.0
  init = fed2.init(root)
  assert_trees_close(params_of(fed2, s1, 1), params_of(fed2, init, 1), rtol=0, atol=0)
  del fed


@pytest.mark.slow
def test_partial_participation_matches_full_round_for_participants():
  data = make_data([20, 25, 30, 35, 40])
  root = jax.random.PRNGKey(3)
  fed = make_fed(data, models=['a', 'b', 'a', 'b', 'a'])
  full, _ = train(fed, fed.init(root), root, 1, 2, 8)
  active = np.array([False, True, True, False, False])
  part, loss = train(fed, fed.init(root), root, 1, 2, 8,
                                 active=active)
  init = fed.init(root)
  assert np.isnan(loss[0]) and np.isfinite(loss[1])
  for k in range(5):
    want = params_of(fed, full if active[k] else init, k)
    assert_trees_close(params_of(fed, part, k), want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_subsets_of_one_bucket_do_not_recompile():
  data = make_data([10] * 8)
  fed = make_fed(data)
  root = jax.random.PRNGKey(0)
  states = fed.init(root)
  kern = fed.cohorts[0].kernels
  for t, members in enumerate([[0, 1, 2], [5, 6, 7, 0], [3, 4, 1]], start=1):
    active = np.zeros(8, bool)
    active[members] = True
    states, _ = train(fed, states, root, t, 1, 5, active=active)
  assert kern._runs[True]._cache_size() == 1  # 3 and 4 clients share the 4-slot bucket
  for t in range(4, 6):
    states, _ = train(fed, states, root, t, 1, 5)
  assert kern._runs[True]._cache_size() == 2  # plus the full cohort, compiled once


@pytest.mark.slow
def test_bit_reproducible_for_a_seed():
  data = make_data([15, 22, 9])
  outs = []
  for _ in range(2):
    fed = make_fed(data, models=['a', 'b', 'a'], bn=True)
    root = jax.random.PRNGKey(7)
    st, _ = train(fed, fed.init(root), root, 1, 2, 4)
    p = fed.predict(st, data.x_public)
    st, _ = distill(fed, st, root, 1, data.x_public, p.mean(0), 1, 10)
    outs.append(np.asarray(fed.predict(st, data.x_public)))
  np.testing.assert_array_equal(outs[0], outs[1])


def test_distill_takes_its_count_on_the_device_and_a_count_of_zero_changes_nothing():
  """The protocol family hands distillation a device count of labelled rows (no read): the
  same training as the host count, and with none, every step is empty."""
  data = make_data([9, 9])
  fed = make_fed(data, tx=optax.adam(1e-2))
  root = jax.random.PRNGKey(0)
  x = data.x_public
  target = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(1), (x.shape[0], 3)))
  start = [params_of(fed, fed.init(root), c) for c in (0, 1)]   # a round donates its states

  def distilled(count):
    states, _ = distill(fed, fed.init(root), root, 1, x, target, 2, 7, count=count)
    return states, [params_of(fed, states, c) for c in (0, 1)]

  _, host = distilled(20)
  _, dev = distilled(jnp.sum(jnp.arange(50) < 20))
  for c in (0, 1):
    assert_trees_close(dev[c], host[c], rtol=0, atol=0)
    assert any(np.any(a != b) for a, b in zip(jax.tree.leaves(host[c]),
                                              jax.tree.leaves(start[c])))
  states, none = distilled(jnp.int32(0))
  for c in (0, 1):
    assert_trees_close(none[c], start[c], rtol=0, atol=0)
  np.testing.assert_array_equal(np.asarray(states[0].opt_state['train'][0].count), [0, 0])


def test_distill_moves_predictions_towards_targets():
  data = make_data([30, 30])
  fed = make_fed(data, bn=True)
  root = jax.random.PRNGKey(0)
  st = fed.init(root)
  x = data.x_public
  target = jnp.tile(jnp.asarray([[0.0, 0.0, 1.0]]), (x.shape[0], 1))
  before = float(fed.predict(st, x)[..., 2].mean())
  st, loss = distill(fed, st, root, 1, x, target, 20, 10)
  after = np.asarray(fed.predict(st, x)[..., 2])
  assert after.mean() > 0.95 > before


def test_predict_zero_rows_for_inactive_and_class_means():
  data = make_data([12, 18, 6])
  fed = make_fed(data, models=['a', 'b', 'b'])
  root = jax.random.PRNGKey(0)
  st = fed.init(root)
  active = np.array([True, False, True])
  p = np.asarray(fed.predict(st, data.x_public, active))
  assert np.all(p[1] == 0)
  np.testing.assert_allclose(p[[0, 2]].sum(-1), 1.0, rtol=1e-5)
  means, counts = fed.class_mean_probs(st)
  fed.class_mean_probs(st)  # a later round: same slots, no new compile
  assert fed.cohorts[1].kernels._class_sums._cache_size() == 1  # compiled once per cohort
  # counts are each client's label histogram; means are averages of predictions.
  np.testing.assert_array_equal(np.asarray(counts), fed.data.client_labels())
  x = np.asarray(data.x_private)
  y = np.asarray(data.y_private)
  rows = np.arange(12, 30)  # client 1
  probs = np.asarray(fed.predict(st, jnp.asarray(x[rows])))[1]
  for c in range(3):
    if (y[rows] == c).any():
      np.testing.assert_allclose(means[1, c], probs[y[rows] == c].mean(0), rtol=1e-5)


def test_evaluate_per_client_test_sets():
  data = make_data([10, 10])
  x_t, y_t = np.asarray(data.x_test), np.asarray(data.y_test)
  tidx, tn = pack_indices([np.arange(0, 20), np.arange(20, 27)])
  import dataclasses
  data = dataclasses.replace(data, test_idx=jnp.asarray(tidx), test_n=tn)
  fed = make_fed(data, models=['a', 'b'])
  st = fed.init(jax.random.PRNGKey(0))
  acc, _ = fed.evaluate(st, per_client_test=True)
  probs = np.asarray(fed.predict(st, jnp.asarray(x_t)))
  want0 = (probs[0, :20].argmax(-1) == y_t[:20]).mean()
  want1 = (probs[1, 20:27].argmax(-1) == y_t[20:27]).mean()
  np.testing.assert_allclose(acc, [want0, want1], rtol=1e-6)
