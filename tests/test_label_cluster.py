"""ACE-pFL EMD clustering (Algorithm 2) and Eq. (3) weights, against hand values."""

import itertools

import numpy as np
import pytest

from fedjax_kd.ops import label_cluster as lc
from fedjax_kd.ops.errors import ParamError


# ---------------------------------------------------------------- distances

def test_spec_disjoint_pair():
  p, q = [.5, .5, 0, 0], [0, 0, .5, .5]
  assert lc.label_distance(p, q, 'tv') == pytest.approx(1.0)
  assert lc.label_distance(p, q, 'l1') == pytest.approx(2.0)
  assert lc.label_distance(p, q, 'sorted_literal') == pytest.approx(0.0)
  # CDFs [.5, 1, 1, 1] vs [0, 0, .5, 1]: .5 + 1 + .5 + 0.
  assert lc.label_distance(p, q, 'emd1d') == pytest.approx(2.0)


def test_emd1d_hand_cases():
  assert lc.label_distance([1, 0, 0], [0, 0, 1], 'emd1d') == pytest.approx(2.0)
  assert lc.label_distance([1, 0, 0], [0, 1, 0], 'emd1d') == pytest.approx(1.0)
  # Move .5 mass one step and .25 mass two steps.
  assert lc.label_distance([.75, .25, 0], [.25, .25, .5], 'emd1d') == pytest.approx(1.0)
  # TV does not see the class positions.
  assert lc.label_distance([1, 0, 0], [0, 0, 1], 'tv') == pytest.approx(1.0)


def test_sorted_literal_hand_case():
  # sorted: [0, .2, .8] vs [.1, .3, .6] -> (.1 + .1 + .2) / 3.
  assert lc.label_distance([.8, 0, .2], [.3, .6, .1], 'sorted_literal') == \
      pytest.approx(0.4 / 3)


@pytest.mark.parametrize('metric', lc.METRICS)
def test_metric_properties(metric):
  rng = np.random.default_rng(0)
  h = lc.label_histograms(rng.integers(0, 20, size=(12, 6)) + (np.arange(6) == 0))
  d = lc.distance_matrix(h, metric)
  np.testing.assert_allclose(d, d.T, atol=1e-15)
  np.testing.assert_allclose(np.diag(d), 0, atol=1e-15)
  assert np.all(d >= 0)
  for i in range(len(h)):
    np.testing.assert_allclose(lc.distances_to(h, h[i], metric), d[i], atol=1e-14)
    assert lc.label_distance(h[i], h[(i + 1) % 12], metric) == pytest.approx(d[i, (i + 1) % 12])
  if metric == 'tv':
    assert np.all(d <= 1 + 1e-12)
    off = d[~np.eye(12, dtype=bool)]
    assert np.all(off > 0)  # distinct random histograms
  if metric == 'l1':
    np.testing.assert_allclose(d, 2 * lc.distance_matrix(h, 'tv'))


def test_label_histograms():
  h = lc.label_histograms([[1, 3], [5, 0]])
  np.testing.assert_allclose(h, [[.25, .75], [1, 0]])
  with pytest.raises(ValueError, match='client 1'):
    lc.label_histograms([[1, 3], [0, 0]])
  with pytest.raises(ValueError):
    lc.label_histograms([[1, -3]])


def test_bad_metric():
  with pytest.raises(ParamError) as err:
    lc.label_distance([1, 0], [0, 1], 'emd')
  assert err.value.param == 'metric'


# ---------------------------------------------------------------- kmeans_1d

def _sse(values, labels):
  values = np.asarray(values, float)
  return sum(np.sum((values[labels == g] - values[labels == g].mean()) ** 2)
             for g in np.unique(labels))


def _brute_force_sse(values, k):
  """Minimum SSE over all splits of the sorted values into k contiguous groups."""
  x = np.sort(np.asarray(values, float))
  best = np.inf
  for cuts in itertools.combinations(range(1, len(x)), k - 1):
    bounds = (0,) + cuts + (len(x),)
    sse = sum(np.sum((x[a:b] - x[a:b].mean()) ** 2) for a, b in zip(bounds, bounds[1:]))
    best = min(best, sse)
  return best


def test_kmeans_1d_spec_case():
  labels, centroids = lc.kmeans_1d([0, .1, .12, .5, .55, 1, .98, .97], 3)
  np.testing.assert_array_equal(labels, [0, 0, 0, 1, 1, 2, 2, 2])
  np.testing.assert_allclose(centroids, [.22 / 3, .525, 2.95 / 3])
  # Order by centroid, not by position.
  labels, _ = lc.kmeans_1d([1, .98, 0, .5, .55, .1, .97, .12], 3)
  np.testing.assert_array_equal(labels, [2, 2, 0, 1, 1, 0, 2, 0])


def test_kmeans_1d_pairs_and_k_eff():
  labels, centroids = lc.kmeans_1d([0, 0, .5, .5, 1, 1], 3)
  np.testing.assert_array_equal(labels, [0, 0, 1, 1, 2, 2])
  np.testing.assert_allclose(centroids, [0, .5, 1])
  # TV under pi = 2 takes values {0, .5, 1}: only 3 distinct values for k = 5.
  labels, centroids = lc.kmeans_1d([.5, 0, 1, 1, .5, .5], 5)
  assert centroids.size == 3
  np.testing.assert_array_equal(labels, [1, 0, 2, 2, 1, 1])
  labels, centroids = lc.kmeans_1d([.3, .3, .3], 2)
  np.testing.assert_array_equal(labels, [0, 0, 0])
  np.testing.assert_allclose(centroids, [.3])
  labels, _ = lc.kmeans_1d([4.0], 1)
  np.testing.assert_array_equal(labels, [0])


def test_kmeans_1d_tie_break():
  # [0, 1, 2] into 2: {0}{1,2} and {0,1}{2} both have SSE .5; the later
  # cluster starts as early as possible -> {0}{1,2}.
  labels, _ = lc.kmeans_1d([2, 0, 1], 2)
  np.testing.assert_array_equal(labels, [1, 0, 1])


@pytest.mark.parametrize('seed', range(30))
def test_kmeans_1d_exact_vs_brute_force(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(1, 10))
  k = int(rng.integers(1, n + 1))
  values = rng.random(n)
  if seed % 2:
    values = np.round(values, 1)  # repeated values
  labels, centroids = lc.kmeans_1d(values, k)
  k_eff = min(k, np.unique(values).size)
  assert centroids.size == k_eff
  assert set(labels.tolist()) == set(range(k_eff))
  assert np.all(np.diff(centroids) > 0)
  assert _sse(values, labels) == pytest.approx(_brute_force_sse(values, k_eff), abs=1e-12)
  for g in range(k_eff):
    assert centroids[g] == pytest.approx(values[labels == g].mean())


def test_kmeans_1d_bad_input():
  with pytest.raises(ValueError):
    lc.kmeans_1d([], 1)
  with pytest.raises(ValueError):
    lc.kmeans_1d([0., np.nan], 1)
  with pytest.raises(ValueError):
    lc.kmeans_1d([0., 1.], 0)


# ---------------------------------------------------------------- kmeans_rows

def test_kmeans_rows_blobs_and_canonical_labels():
  rng = np.random.default_rng(1)
  centers = np.array([[5., 0.], [0., 0.], [0., 5.]])
  truth = np.array([2, 0, 1, 2, 1, 0, 0, 1, 2, 2, 0, 1])
  pts = centers[truth] + 0.1 * rng.standard_normal((12, 2))
  labels = lc.kmeans_rows(pts, 3, seed=0)
  # Canonical relabelling of the truth in order of first appearance.
  np.testing.assert_array_equal(labels, [0, 1, 2, 0, 2, 1, 1, 2, 0, 0, 1, 2])
  np.testing.assert_array_equal(lc.kmeans_rows(pts, 3, seed=0),
                                lc.kmeans_rows(pts, 3, seed=0))
  np.testing.assert_array_equal(lc.kmeans_rows(pts, 3, seed=7), labels)


def test_kmeans_rows_k_eff_duplicates():
  pts = np.array([[1., 0.], [0., 1.], [1., 0.], [0., 1.]])
  np.testing.assert_array_equal(lc.kmeans_rows(pts, 4, seed=0), [0, 1, 0, 1])
  np.testing.assert_array_equal(lc.kmeans_rows(pts, 1, seed=0), [0, 0, 0, 0])
  same = np.ones((5, 3))
  np.testing.assert_array_equal(lc.kmeans_rows(same, 3, seed=0), np.zeros(5))


def test_kmeans_rows_all_clusters_nonempty():
  rng = np.random.default_rng(3)
  pts = rng.random((9, 4))
  labels = lc.kmeans_rows(pts, 9, seed=2)
  assert sorted(labels.tolist()) == list(range(9))


# ---------------------------------------------------------------- cluster_clients

# 6 clients, 4 classes: two clients each on classes {0,1}, {1,2} (one class
# shared with {0,1}) and {2,3} (disjoint from {0,1}). Reference = client 0.
COUNTS = np.array([
    [50, 50, 0, 0],
    [25, 25, 0, 0],   # same histogram as client 0
    [0, 40, 40, 0],
    [0, 10, 10, 0],   # same histogram as client 2
    [0, 0, 30, 30],
    [0, 0, 5, 5],     # same histogram as client 4
])


def test_cluster_clients_vector_hand_case():
  res = lc.cluster_clients(COUNTS, 3, method='vector', reference=0)
  np.testing.assert_allclose(res.distances, [0, 0, .5, .5, 1, 1])
  np.testing.assert_array_equal(res.labels, [0, 0, 1, 1, 2, 2])
  assert res.num_clusters == 3 and res.reference == 0
  np.testing.assert_allclose(res.intra_distance, [0, 0, 0])
  # Reference in the middle group: {0,1} and {4,5} are both at TV .5 -> merged
  # (clustering by distance to one reference cannot tell the two groups apart).
  res = lc.cluster_clients(COUNTS, 3, method='vector', reference=3)
  np.testing.assert_allclose(res.distances, [.5, .5, 0, 0, .5, .5])
  np.testing.assert_array_equal(res.labels, [1, 1, 0, 0, 1, 1])
  assert res.num_clusters == 2  # only two distinct distances
  # Mean over the 6 pairs of {0,1,4,5}: four cross pairs at TV 1, two at 0.
  np.testing.assert_allclose(res.intra_distance, [0, 4 / 6])


def test_cluster_clients_intra_distance_hand():
  counts = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1]])
  res = lc.cluster_clients(counts, 2, method='vector', reference=0)
  # TV to client 0: [0, .5, 1]. {0}{.5, 1} and {0, .5}{1} tie (SSE .125); the
  # documented tie break (earliest start of the later cluster) gives {0}{1, 2}.
  np.testing.assert_allclose(res.distances, [0, .5, 1])
  np.testing.assert_array_equal(res.labels, [0, 1, 1])
  # TV(client 1 = [.5,.5,0], client 2 = [0,0,1]) = 1.
  np.testing.assert_allclose(res.intra_distance, [0, 1])


def test_cluster_clients_matrix_groups_identical():
  res = lc.cluster_clients(COUNTS, 3, method='matrix', seed=0)
  np.testing.assert_array_equal(res.labels, [0, 0, 1, 1, 2, 2])
  assert res.reference == -1 and res.distances.shape == (6, 6)
  np.testing.assert_allclose(res.intra_distance, 0)
  res = lc.cluster_clients(COUNTS, 6, method='matrix', seed=0)
  assert res.num_clusters == 3  # three distinct rows


def test_cluster_clients_hist_override():
  noisy = lc.label_histograms(COUNTS[::-1])
  res = lc.cluster_clients(COUNTS, 3, reference=0, hist=noisy)
  np.testing.assert_allclose(res.distances, [0, 0, .5, .5, 1, 1])
  np.testing.assert_array_equal(res.labels, [0, 0, 1, 1, 2, 2])
  res = lc.cluster_clients(COUNTS, 3, reference=5, hist=noisy)
  np.testing.assert_allclose(res.distances, [1, 1, .5, .5, 0, 0])


@pytest.mark.parametrize('k', [0, 7, 2.0, True])
def test_cluster_clients_bad_num_clusters(k):
  with pytest.raises(ParamError) as err:
    lc.cluster_clients(COUNTS, k, reference=0)
  assert err.value.param == 'num_clusters'
  assert 'num_clusters' in str(err.value)


def test_cluster_clients_bad_args():
  with pytest.raises(ParamError, match='reference'):
    lc.cluster_clients(COUNTS, 2)
  with pytest.raises(ParamError, match='reference'):
    lc.cluster_clients(COUNTS, 2, reference=6)
  with pytest.raises(ParamError, match='method'):
    lc.cluster_clients(COUNTS, 2, method='graph', reference=0)
  with pytest.raises(ParamError, match='metric'):
    lc.cluster_clients(COUNTS, 2, metric='kl', reference=0)


# ---------------------------------------------------------------- Eq. (3)

def test_weights_equal_sizes_are_plain_mean():
  for labels in ([0, 0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5], [3, 3, 3, 3, 3, 3]):
    np.testing.assert_allclose(lc.cluster_weights(labels, [7] * 6), np.full(6, 1 / 6))


def test_weights_spec_case():
  a = lc.cluster_weights([0, 0, 1, 2, 2, 2], [10, 30, 20, 5, 5, 30])
  np.testing.assert_allclose(a, [.2, .2, .2, 40 / 300, 40 / 300, 40 / 300])
  assert a.dtype == np.float64 and a.sum() == pytest.approx(1.0)


def test_weights_single_cluster():
  np.testing.assert_allclose(lc.cluster_weights([0] * 4, [1, 2, 3, 100]), [.25] * 4)


def test_weights_inactive_clients():
  labels, sizes = [0, 0, 1, 2, 2, 2], [10, 30, 20, 5, 5, 30]
  # Client 1 inactive: D = 70; cluster 0 = {0}: 10/70; cluster 1: 20/70;
  # cluster 2: 40/70 shared by 3.
  a = lc.cluster_weights(labels, sizes, [True, False, True, True, True, True])
  np.testing.assert_allclose(a, [1 / 7, 0, 2 / 7, 4 / 21, 4 / 21, 4 / 21])
  assert a.sum() == pytest.approx(1.0)
  # Client 2 inactive: its cluster drops out, the others renormalise over D = 80.
  a = lc.cluster_weights(labels, sizes, [True, True, False, True, True, True])
  np.testing.assert_allclose(a, [.25, .25, 0, 1 / 6, 1 / 6, 1 / 6])
  assert a.sum() == pytest.approx(1.0)
  with pytest.raises(ValueError):
    lc.cluster_weights(labels, sizes, [False] * 6)
