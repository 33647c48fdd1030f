"""COMET per-sample k-means and nearest-centroid selection, on hand-worked cases."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_kd.ops import cluster

A0, A1 = [1.0, 0.0], [0.9, 0.1]  # group A, mean [0.95, 0.05]
B0, B1 = [0.0, 1.0], [0.2, 0.8]  # group B, mean [0.1, 0.9]
MEAN_A, MEAN_B = [0.95, 0.05], [0.1, 0.9]

# Three samples, K=4 clients, C=2, with a different grouping per sample.
POINTS = np.asarray([
    [A0, A1, B0, B1],  # clients {0,1} vs {2,3}
    [A0, B0, A1, B1],  # {0,2} vs {1,3}
    [B1, A0, A1, B0],  # {1,2} vs {0,3}
], np.float32)
GROUP_A = [[0, 1], [0, 2], [1, 2]]
GROUP_B = [[2, 3], [1, 3], [0, 3]]


def _sorted(centroids):
  """Centroids of each sample in decreasing order of the first class."""
  c = np.asarray(centroids)
  order = np.argsort(-c[..., 0], axis=-1)
  return np.take_along_axis(c, order[..., None], axis=-2)


@pytest.mark.parametrize('seed', range(6))
def test_two_obvious_groups(seed):
  cent, assign = cluster.kmeans_per_sample(
      POINTS, jnp.ones(4, bool), 2, jax.random.PRNGKey(seed))
  assert cent.shape == (3, 2, 2) and assign.shape == (3, 4)
  assert assign.dtype == jnp.int32
  np.testing.assert_allclose(_sorted(cent), [[MEAN_A, MEAN_B]] * 3, atol=1e-6)
  assign = np.asarray(assign)
  cent = np.asarray(cent)
  for i in range(3):
    ga, gb = GROUP_A[i], GROUP_B[i]
    assert assign[i, ga[0]] == assign[i, ga[1]] != assign[i, gb[0]] == assign[i, gb[1]]
    np.testing.assert_allclose(cent[i, assign[i, ga[0]]], MEAN_A, atol=1e-6)
    np.testing.assert_allclose(cent[i, assign[i, gb[0]]], MEAN_B, atol=1e-6)


@pytest.mark.parametrize('seed', range(4))
def test_masked_points_are_ignored(seed):
  wild = np.full((3, 1, 2), [100.0, -100.0], np.float32)
  points = np.concatenate([POINTS, wild], axis=1)  # K=5, client 4 absent
  mask = jnp.asarray([True] * 4 + [False])
  cent, assign = cluster.kmeans_per_sample(points, mask, 2, jax.random.PRNGKey(seed))
  np.testing.assert_allclose(_sorted(cent), [[MEAN_A, MEAN_B]] * 3, atol=1e-6)
  assign = np.asarray(assign)
  for i in range(3):
    ga, gb = GROUP_A[i], GROUP_B[i]
    assert assign[i, ga[0]] == assign[i, ga[1]] != assign[i, gb[0]] == assign[i, gb[1]]
  # Per-row mask [n, K]: a different client missing in each sample.
  pts = np.asarray([[A0, A1, B0, B1, [5.0, 5.0]],
                    [[5.0, 5.0], A0, A1, B0, B1]], np.float32)
  row_mask = jnp.asarray([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]], bool)
  cent, _ = cluster.kmeans_per_sample(pts, row_mask, 2, jax.random.PRNGKey(seed))
  np.testing.assert_allclose(_sorted(cent), [[MEAN_A, MEAN_B]] * 2, atol=1e-6)


def test_single_cluster_is_masked_mean():
  points = np.asarray([[[0.2, 0.8], [0.6, 0.4], [0.7, 0.3]],
                       [[0.1, 0.9], [0.3, 0.7], [0.9, 0.1]]], np.float32)
  mask = jnp.asarray([[True, True, False], [True, True, True]])
  cent, assign = cluster.kmeans_per_sample(points, mask, 1, jax.random.PRNGKey(0))
  np.testing.assert_allclose(cent, [[[0.4, 0.6]], [[13 / 30, 17 / 30]]], atol=1e-6)
  np.testing.assert_array_equal(assign, np.zeros((2, 3)))


def test_empty_cluster_zero_or_keep():
  # All K points identical: both initial centroids coincide, every point ties
  # and goes to cluster 0 (lowest index), cluster 1 receives nothing.
  points = np.full((2, 4, 2), [0.3, 0.7], np.float32)
  key = jax.random.PRNGKey(1)
  cent, assign = cluster.kmeans_per_sample(points, jnp.ones(4, bool), 2, key)
  np.testing.assert_allclose(cent, [[[0.3, 0.7], [0.0, 0.0]]] * 2, atol=1e-7)
  np.testing.assert_array_equal(assign, np.zeros((2, 4)))
  cent, assign = cluster.kmeans_per_sample(
      points, jnp.ones(4, bool), 2, key, empty='keep')
  np.testing.assert_allclose(cent, [[[0.3, 0.7], [0.3, 0.7]]] * 2, atol=1e-7)
  np.testing.assert_array_equal(assign, np.zeros((2, 4)))


def test_fewer_valid_points_than_clusters():
  # One valid client, c=2: both inits are that point (drawn with replacement).
  points = np.asarray([[[9.0, 9.0], [0.25, 0.75], [-9.0, 3.0]]], np.float32)
  mask = jnp.asarray([False, True, False])
  cent, assign = cluster.kmeans_per_sample(points, mask, 2, jax.random.PRNGKey(3))
  np.testing.assert_allclose(cent, [[[0.25, 0.75], [0.0, 0.0]]], atol=1e-7)
  assert int(assign[0, 1]) == 0
  cent, _ = cluster.kmeans_per_sample(points, mask, 2, jax.random.PRNGKey(3),
                                      empty='keep')
  np.testing.assert_allclose(cent, [[[0.25, 0.75], [0.25, 0.75]]], atol=1e-7)


def test_nearest_centroid_with_client_axis():
  centroids = jnp.asarray([[MEAN_A, MEAN_B], [[1.0, 0.0], [0.0, 1.0]]])  # [n=2, c=2, C=2]
  probs = jnp.asarray([
      [[0.8, 0.2], [0.4, 0.6]],  # client 0
      [[0.3, 0.7], [0.1, 0.9]],  # client 1
      [[0.6, 0.4], [0.5, 0.5]],  # client 2; sample 1 is an exact tie
  ])  # [K=3, n=2, C=2]
  want = [
      [MEAN_A, [0.0, 1.0]],
      [MEAN_B, [0.0, 1.0]],
      [MEAN_A, [1.0, 0.0]],  # tie -> lowest index
  ]
  got = cluster.nearest_centroid(probs, centroids)
  assert got.shape == (3, 2, 2)
  np.testing.assert_allclose(got, want, atol=1e-7)
  # Without a leading axis, and per client under vmap.
  np.testing.assert_allclose(cluster.nearest_centroid(probs[1], centroids), want[1],
                             atol=1e-7)
  vm = jax.vmap(cluster.nearest_centroid, in_axes=(0, None))(probs, centroids)
  np.testing.assert_allclose(vm, want, atol=1e-7)


@pytest.mark.slow
def test_deterministic_jittable_and_padding_independent():
  key = jax.random.PRNGKey(7)
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(5, 6, 4)).astype(np.float32)
  points = np.asarray(jax.nn.softmax(logits * 3, axis=-1))
  mask = jnp.asarray(rng.random((5, 6)) > 0.3).at[:, 0].set(True)
  c1, a1 = cluster.kmeans_per_sample(points, mask, 3, key)
  c2, a2 = cluster.kmeans_per_sample(points, mask, 3, key)
  np.testing.assert_array_equal(c1, c2)
  np.testing.assert_array_equal(a1, a2)
  # Wrapped in an outer jit.
  f = jax.jit(lambda p, m, k: cluster.kmeans_per_sample(p, m, 3, k, max_iter=50))
  c3, a3 = f(points, mask, key)
  np.testing.assert_allclose(c3, c1, atol=1e-6)
  np.testing.assert_array_equal(a3, a1)
  # The first 3 samples do not depend on the 2 that follow them.
  c4, a4 = cluster.kmeans_per_sample(points[:3], mask[:3], 3, key)
  np.testing.assert_allclose(c4, c1[:3], atol=1e-6)
  np.testing.assert_array_equal(a4, a1[:3])
  # Every valid point is assigned to its nearest final centroid.
  d = ((points[:, :, None, :] - np.asarray(c1)[:, None]) ** 2).sum(-1)
  m = np.asarray(mask)
  np.testing.assert_array_equal(np.asarray(a1)[m], d.argmin(-1)[m])


def test_bad_empty_mode():
  with pytest.raises(ValueError):
    cluster.kmeans_per_sample(POINTS, jnp.ones(4, bool), 2, jax.random.PRNGKey(0),
                              empty='nan')
