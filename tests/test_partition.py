"""Tests for fedjax_kd.data.partition."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

from fedjax_kd.data import partition as P
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError



from tests.conftest import MNIST_COUNTS, mnist_path as _mnist_path


def _balanced(n_per_class: int = 6000, c: int = 10,
              seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.permutation(np.repeat(np.arange(c), n_per_class))


def _mnist_like(seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return rng.permutation(np.repeat(np.arange(10), MNIST_COUNTS))


def _assert_disjoint(parts, n=None, cover=False):
  allidx = np.concatenate(parts)
  assert allidx.dtype == np.int64
  assert len(np.unique(allidx)) == len(allidx), 'clients overlap'
  if cover:
    np.testing.assert_array_equal(np.sort(allidx), np.arange(n))


def _hist(labels, parts, c):
  return P.label_histogram(labels, parts, c)


# ----------------------------------------------------------------------------
# Literal ports of the authors' code (global np.random replaced by `rs`), used
# to check that the fast implementations consume the RNG identically.
# ----------------------------------------------------------------------------


def _scarlet_reference(targets, num_clients, num_classes, dir_alpha,
                       client_sample_nums, rs, class_priors=None):
  """SCARLET dataset/functional.py client_inner_dirichlet_partition_faster."""
  targets = np.array(targets)
  client_sample_nums = np.array(client_sample_nums)
  if class_priors is None:
    class_priors = rs.dirichlet(alpha=[dir_alpha] * num_classes,
                                size=num_clients)
  prior_cumsum = np.cumsum(class_priors, axis=1)
  idx_list = [np.where(targets == i)[0] for i in range(num_classes)]
  class_amount = [len(idx_list[i]) for i in range(num_classes)]
  client_indices = [
      np.zeros(client_sample_nums[cid]).astype(np.int64)
      for cid in range(num_clients)
  ]
  while np.sum(client_sample_nums) != 0:
    curr_cid = rs.randint(num_clients)
    if client_sample_nums[curr_cid] <= 0:
      continue
    client_sample_nums[curr_cid] -= 1
    curr_prior = prior_cumsum[curr_cid]
    while True:
      curr_class = int(np.argmax(rs.uniform() <= curr_prior))
      if class_amount[curr_class] <= 0:
        while True:
          new_class = rs.randint(num_classes)
          if class_amount[new_class] > 0:
            curr_class = new_class
            break
      class_amount[curr_class] -= 1
      client_indices[curr_cid][client_sample_nums[curr_cid]] = idx_list[
          curr_class][class_amount[curr_class]]
      break
  return client_indices, class_priors


def _niid_bench_reference(y_train, n_parties, num_classes, beta, rs,
                          min_require_size=10):
  """NIID-Bench partition_data, partition == 'noniid-labeldir'."""
  min_size = 0
  n = y_train.shape[0]
  idx_batch = None
  while min_size < min_require_size:
    idx_batch = [[] for _ in range(n_parties)]
    for k in range(num_classes):
      idx_k = np.where(y_train == k)[0]
      rs.shuffle(idx_k)
      proportions = rs.dirichlet(np.repeat(beta, n_parties))
      proportions = np.array([
          p * (len(idx_j) < n / n_parties)
          for p, idx_j in zip(proportions, idx_batch)
      ])
      proportions = proportions / proportions.sum()
      proportions = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
      idx_batch = [
          idx_j + idx.tolist()
          for idx_j, idx in zip(idx_batch, np.split(idx_k, proportions))
      ]
      min_size = min([len(idx_j) for idx_j in idx_batch])
  for j in range(n_parties):
    rs.shuffle(idx_batch[j])
  return idx_batch


# ----------------------------------------------------------------------------
# iid
# ----------------------------------------------------------------------------


def test_iid_sizes_and_cover():
  y = _balanced(10, 10)  # N = 100
  part = P.partition('iid', y, 7, num_classes=10, seed=3)
  sizes = part.sizes
  assert sizes.max() - sizes.min() <= 1
  assert sizes.sum() == 100
  _assert_disjoint(part.client_indices, 100, cover=True)
  assert part.class_priors.shape == (10, 7)
  np.testing.assert_allclose(part.class_priors.sum(axis=1), 1.0)


def test_iid_matches_niid_bench_homo():
  y = _balanced(30, 10)
  part = P.partition('iid', y, 9, num_classes=10, seed=11)
  expected = np.array_split(np.random.RandomState(11).permutation(300), 9)
  for a, b in zip(part.client_indices, expected):
    np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------
# shards
# ----------------------------------------------------------------------------


def test_shards_dsfl_acceptance_sorted_set():
  # DS-FL: 20,000 private samples, 100 clients x 2 shards of 100.
  y = np.sort(_mnist_like()[:20000])
  part = P.partition('shards', y, 100, num_classes=10, seed=0)
  np.testing.assert_array_equal(part.sizes, np.full(100, 200))
  _assert_disjoint(part.client_indices, 20000, cover=True)
  ncls = (_hist(y, part.client_indices, 10) > 0).sum(axis=1)
  assert (ncls <= 2).mean() >= 0.9
  assert ncls.max() <= 4
  # Each shard is a contiguous run of the label-sorted order.
  for idx in part.client_indices:
    for shard in idx.reshape(2, 100):
      assert np.all(np.diff(np.sort(shard)) == 1)


def test_shards_random_order_dsfl_acceptance():
  y = _mnist_like(seed=5)[:20000]
  part = P.partition('shards', y, 100, num_classes=10, seed=1)
  ncls = (_hist(y, part.client_indices, 10) > 0).sum(axis=1)
  assert (ncls <= 2).mean() >= 0.9


def test_shards_assignment_is_permutation_of_shards():
  y = np.repeat(np.arange(4), 10)  # sorted, N = 40, 8 shards of 5
  part = P.shards(y, 4, num_classes=4, rng=np.random.default_rng(7),
                  shards_per_client=2)
  pi = np.random.default_rng(7).permutation(8)
  order = np.argsort(y, kind='stable').reshape(8, 5)
  for k in range(4):
    np.testing.assert_array_equal(part.client_indices[k],
                                  order[pi[2 * k:2 * k + 2]].reshape(-1))


def test_shards_drops_remainder_in_index_order():
  y = _balanced(100, 10)[:1005]
  part = P.partition('shards', y, 10, num_classes=10, seed=0)
  np.testing.assert_array_equal(part.sizes, np.full(10, 100))
  allidx = np.sort(np.concatenate(part.client_indices))
  np.testing.assert_array_equal(allidx, np.arange(1000))


def test_shards_not_enough_samples():
  y = _balanced(1, 10)
  with pytest.raises(ParamError, match='^shards_per_client='):
    P.partition('shards', y, 6, num_classes=10, seed=0)
  with pytest.raises(ParamError, match='^shards_per_client='):
    P.partition('shards', y, 2, num_classes=10, seed=0, shards_per_client=0)


# ----------------------------------------------------------------------------
# client_dirichlet
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('n,k', [(60000, 1000), (10007, 100), (999, 10)])
def test_client_dirichlet_balanced_sizes(n, k):
  y = _balanced(n // 10 + 1, 10)[:n]
  part = P.partition('client_dirichlet', y, k, num_classes=10, seed=42,
                     alpha=0.3)
  np.testing.assert_array_equal(part.sizes, np.full(k, n // k))
  _assert_disjoint(part.client_indices)
  assert part.class_priors.shape == (k, 10)
  np.testing.assert_allclose(part.class_priors.sum(axis=1), 1.0)


@pytest.mark.parametrize('seed,alpha,n,k,c', [(42, 0.3, 2000, 20, 10),
                                              (0, 0.05, 1000, 10, 10),
                                              (7, 1.0, 503, 7, 3),
                                              (1, 0.5, 40, 1, 4)])
def test_client_dirichlet_matches_scarlet_code(seed, alpha, n, k, c):
  y = _balanced(n // c + 1, c, seed=seed)[:n]
  ref, ref_priors = _scarlet_reference(y, k, c, alpha, np.full(k, n // k),
                                       np.random.RandomState(seed))
  part = P.client_dirichlet(y, k, num_classes=c, alpha=alpha,
                            rng=np.random.RandomState(seed))
  np.testing.assert_array_equal(part.class_priors, ref_priors)
  for a, b in zip(part.client_indices, ref):
    np.testing.assert_array_equal(a, b)


def test_client_dirichlet_histogram_follows_prior():
  y = _balanced(6000, 10)
  part = P.partition('client_dirichlet', y, 100, num_classes=10, seed=0,
                     alpha=0.05)
  hist = _hist(y, part.client_indices, 10).astype(float)
  emp = hist / hist.sum(axis=1, keepdims=True)
  priors = part.class_priors
  # alpha = 0.05: most clients are dominated by one class, and it is the class
  # their prior favours. (Popular classes run out: 6,000 samples per class for
  # 600-sample clients, so late draws fall back to uniform classes.)
  assert (emp.max(axis=1) >= 0.5).mean() >= 0.7
  assert (emp.argmax(axis=1) == priors.argmax(axis=1)).mean() >= 0.9
  # L1 distance between the empirical histogram and the prior is small
  # (uniform histograms would be ~1.6 away from these priors).
  assert np.abs(emp - priors).sum(axis=1).mean() < 0.35
  uniform = np.full_like(priors, 0.1)
  assert np.abs(uniform - priors).sum(axis=1).mean() > 1.2


def test_client_dirichlet_fast():
  y = _balanced(6000, 10)
  t = time.perf_counter()
  part = P.partition('client_dirichlet', y, 1000, num_classes=10, seed=1,
                     alpha=0.05)
  assert time.perf_counter() - t < 3.0
  np.testing.assert_array_equal(part.sizes, np.full(1000, 60))


# ----------------------------------------------------------------------------
# dirichlet / niid_labeldir
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('name', ['dirichlet', 'niid_labeldir'])
def test_dirichlet_min_size_and_cover(name):
  y = _mnist_like()
  part = P.partition(name, y, 100, num_classes=10, seed=0, alpha=0.1)
  assert part.sizes.min() >= 10
  _assert_disjoint(part.client_indices, len(y), cover=True)
  shares = part.class_priors
  assert shares.shape == (10, 100)
  np.testing.assert_allclose(shares.sum(axis=1), 1.0)
  hist = _hist(y, part.client_indices, 10)
  np.testing.assert_allclose(shares, hist.T / hist.sum(axis=0)[:, None])
  # Label skew: with alpha = 0.1 a typical client sees few classes.
  assert np.median((hist > 0).sum(axis=1)) <= 6


def test_dirichlet_matches_niid_bench_code():
  y = _balanced(200, 10, seed=3)
  ref = _niid_bench_reference(y, 20, 10, 0.5, np.random.RandomState(4))
  part = P.dirichlet(y, 20, num_classes=10, alpha=0.5,
                     rng=np.random.RandomState(4))
  for a, b in zip(part.client_indices, ref):
    np.testing.assert_array_equal(a, np.array(b, np.int64))


def test_dirichlet_matches_niid_bench_code_with_retries():
  # K = 200 over 2,000 samples at alpha = 0.3 fails the first attempts.
  y = _balanced(200, 10, seed=8)
  rs = np.random.RandomState(2)
  ref = _niid_bench_reference(y, 50, 10, 0.3, rs)
  part = P.dirichlet(y, 50, num_classes=10, alpha=0.3,
                     rng=np.random.RandomState(2))
  for a, b in zip(part.client_indices, ref):
    np.testing.assert_array_equal(a, np.array(b, np.int64))


def test_niid_labeldir_is_alias():
  y = _balanced(300, 10)
  a = P.partition('dirichlet', y, 30, num_classes=10, seed=9, alpha=0.2)
  b = P.partition('niid_labeldir', y, 30, num_classes=10, seed=9, alpha=0.2)
  for u, v in zip(a.client_indices, b.client_indices):
    np.testing.assert_array_equal(u, v)


def test_dirichlet_repair_terminates_adversarial():
  # PFLlib #130: the plain retry loop never ends here.
  y = _balanced(1200, 10)  # N = 12,000 over K = 1000: 12 per client on average
  t = time.perf_counter()
  with pytest.warns(RuntimeWarning, match='min_size'):
    part = P.partition('dirichlet', y, 1000, num_classes=10, seed=0,
                       alpha=0.01)
  assert time.perf_counter() - t < 20.0
  assert part.sizes.min() >= 10
  _assert_disjoint(part.client_indices, 12000, cover=True)
  # Still heavily skewed: most clients hold one class.
  ncls = (_hist(y, part.client_indices, 10) > 0).sum(axis=1)
  assert np.median(ncls) <= 2


def test_dirichlet_repair_is_deterministic_and_minimal():
  y = _balanced(30, 10)  # N = 300, K = 30, min 10: every client exactly 10.
  with pytest.warns(RuntimeWarning):
    a = P.dirichlet(y, 30, num_classes=10, alpha=0.1, min_size=10,
                    max_retries=3, rng=np.random.RandomState(0))
  with pytest.warns(RuntimeWarning):
    b = P.dirichlet(y, 30, num_classes=10, alpha=0.1, min_size=10,
                    max_retries=3, rng=np.random.RandomState(0))
  np.testing.assert_array_equal(a.sizes, np.full(30, 10))
  for u, v in zip(a.client_indices, b.client_indices):
    np.testing.assert_array_equal(u, v)
  _assert_disjoint(a.client_indices, 300, cover=True)


def test_dirichlet_infeasible_min_size():
  y = _balanced(10, 10)
  with pytest.raises(ParamError, match='^min_size='):
    P.partition('dirichlet', y, 20, num_classes=10, seed=0, min_size=10)


def test_dirichlet_no_warning_when_feasible():
  y = _balanced(5000, 10)
  with warnings.catch_warnings():
    warnings.simplefilter('error')
    part = P.partition('dirichlet', y, 100, num_classes=10, seed=1, alpha=0.5)
  assert part.sizes.min() >= 10


# ----------------------------------------------------------------------------
# classes (#C = k)
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('k_labels', [1, 2, 3, 10])
def test_classes_exact_labels(k_labels):
  y = _balanced(600, 10)
  k = 25
  part = P.partition('classes', y, k, num_classes=10, seed=4,
                     classes_per_client=k_labels)
  hist = _hist(y, part.client_indices, 10)
  assert ((hist > 0).sum(axis=1) == k_labels).all()
  for i in range(k):
    assert hist[i, i % 10] > 0
  _assert_disjoint(part.client_indices)
  # Each held label is split equally (within 1) among its holders, and every
  # sample of a held label is used.
  for c in range(10):
    counts = hist[:, c][hist[:, c] > 0]
    assert counts.max() - counts.min() <= 1
    assert counts.sum() == 600
  if k_labels == 10:
    _assert_disjoint(part.client_indices, len(y), cover=True)


def test_classes_too_many_labels():
  y = _balanced(10, 10)
  with pytest.raises(ParamError, match='^classes_per_client='):
    P.partition('classes', y, 5, num_classes=10, seed=0, classes_per_client=11)


# ----------------------------------------------------------------------------
# Determinism, validation, performance.
# ----------------------------------------------------------------------------


@pytest.mark.parametrize('name', P.PARTITIONERS)
def test_determinism_and_seed_dependence(name):
  y = _balanced(200, 10)
  a = P.partition(name, y, 20, num_classes=10, seed=5)
  b = P.partition(name, y, 20, num_classes=10, seed=5)
  c = P.partition(name, y, 20, num_classes=10, seed=6)
  for u, v in zip(a.client_indices, b.client_indices):
    np.testing.assert_array_equal(u, v)
  assert any(
      len(u) != len(v) or not np.array_equal(u, v)
      for u, v in zip(a.client_indices, c.client_indices))


@pytest.mark.parametrize('name', ['client_dirichlet', 'dirichlet',
                                  'niid_labeldir'])
@pytest.mark.parametrize('alpha', [0, -1.0, float('nan'), float('inf'), 'x'])
def test_bad_alpha(name, alpha):
  with pytest.raises(ParamError, match='^alpha='):
    P.partition(name, _balanced(20, 10), 5, num_classes=10, seed=0,
                alpha=alpha)


@pytest.mark.parametrize('name', P.PARTITIONERS)
@pytest.mark.parametrize('k', [0, -3, 201, 2.5])
def test_bad_num_clients(name, k):
  with pytest.raises(ParamError, match='^num_clients='):
    P.partition(name, _balanced(20, 10), k, num_classes=10, seed=0)


def test_bad_name_and_labels():
  y = _balanced(20, 10)
  with pytest.raises(ParamError, match='^name=') as e:
    P.partition('dir', y, 5, num_classes=10, seed=0)
  assert "'client_dirichlet'" in str(e.value)
  with pytest.raises(DataError):
    P.partition('iid', y, 5, num_classes=5, seed=0)  # labels >= num_classes
  with pytest.raises(DataError):
    P.partition('iid', y.reshape(20, 10), 5, num_classes=10, seed=0)
  with pytest.raises(ParamError, match='^num_classes='):
    P.partition('iid', y, 5, num_classes=0, seed=0)
  with pytest.raises(ParamError, match='^seed='):
    P.partition('iid', y, 5, num_classes=10, seed=-1)
  with pytest.raises(TypeError):
    P.iid(y, 5, num_classes=10, rng=np.random.default_rng(0))


@pytest.mark.parametrize('name', P.PARTITIONERS)
def test_speed_k1000_60000(name):
  y = _balanced(6000, 10)
  t = time.perf_counter()
  part = P.partition(name, y, 1000, num_classes=10, seed=0)
  elapsed = time.perf_counter() - t
  assert elapsed < 3.0, f'{name} took {elapsed:.2f}s'
  assert len(part.client_indices) == 1000
  assert part.sizes.min() >= 1


@pytest.mark.parametrize('name', P.PARTITIONERS)
def test_real_mnist_labels(name):
  path = _mnist_path()
  if not path.exists():
    pytest.skip(f'{path} not present')
  with np.load(path, allow_pickle=False) as f:
    y = f['y_train'].astype(np.int64)
  np.testing.assert_array_equal(np.bincount(y), MNIST_COUNTS)
  t = time.perf_counter()
  part = P.partition(name, y, 1000, num_classes=10, seed=0)
  assert time.perf_counter() - t < 3.0
  _assert_disjoint(part.client_indices)
  if name in ('iid', 'dirichlet', 'niid_labeldir'):
    _assert_disjoint(part.client_indices, 60000, cover=True)


# ----------------------------------------------------------------------------
# Per-client test splits.
# ----------------------------------------------------------------------------


def test_test_like_client_dirichlet():
  y = _balanced(5000, 10)
  yt = _balanced(1000, 10, seed=1)
  part = P.partition('client_dirichlet', y, 100, num_classes=10, seed=42,
                     alpha=0.05)
  tests = P.partition_test_like('client_dirichlet', part, yt, 100,
                                num_classes=10, seed=42, per_client=None)
  assert [len(t) for t in tests] == [100] * 100
  _assert_disjoint(tests, 10000, cover=True)
  tr = _hist(y, part.client_indices, 10).astype(float)
  te = _hist(yt, tests, 10).astype(float)
  tr /= tr.sum(1, keepdims=True)
  te /= te.sum(1, keepdims=True)
  assert (tr.argmax(1) == te.argmax(1)).mean() >= 0.9
  assert np.abs(tr - te).sum(1).mean() < 0.4
  # Same priors, same sampling loop: equals the SCARLET code on the test set.
  ref, _ = _scarlet_reference(yt, 100, 10, None, np.full(100, 100),
                              np.random.RandomState(P._test_seed(42)),
                              class_priors=part.class_priors)
  for a, b in zip(tests, ref):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ParamError, match='^per_client='):
    P.partition_test_like('client_dirichlet', part, yt, 100, num_classes=10,
                          seed=0, per_client=101)


@pytest.mark.parametrize('name', ['dirichlet', 'niid_labeldir', 'iid',
                                  'shards', 'classes'])
def test_test_like_proportional(name):
  y = _balanced(5000, 10)
  yt = _balanced(1000, 10, seed=1)
  part = P.partition(name, y, 50, num_classes=10, seed=3, alpha=0.3)
  tests = P.partition_test_like(name, part, yt, 50, num_classes=10, seed=3,
                                per_client=None)
  _assert_disjoint(tests)
  tr = _hist(y, part.client_indices, 10)
  te = _hist(yt, tests, 10)
  # A client never gets test samples of a class it has no training data of,
  # and per class the counts are the train counts scaled by m_c / n_c = 1/5.
  assert np.all(te[tr == 0] == 0)
  assert np.all(np.abs(te - tr / 5) <= 1.0 + 1e-9)
  if name != 'classes':  # every class is held by someone
    assert sum(len(t) for t in tests) == 10000
  if name == 'iid':
    assert all(190 <= len(t) <= 210 for t in tests)


def test_test_like_validation():
  y = _balanced(100, 10)
  part = P.partition('iid', y, 10, num_classes=10, seed=0)
  with pytest.raises(ParamError, match='^num_clients='):
    P.partition_test_like('iid', part, y, 11, num_classes=10, seed=0,
                          per_client=None)
  with pytest.raises(ParamError, match='^name='):
    P.partition_test_like('nope', part, y, 10, num_classes=10, seed=0,
                          per_client=None)
