"""Tests for fedjax_kd.data.splits."""

from __future__ import annotations

import numpy as np
import pytest

from fedjax_kd.data import sources, splits
from fedjax_kd.data.sources import ArrayDataset
from fedjax_kd.data.splits import FDSplit, fd_split
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError


def _indexed(n: int, n_test: int = 10, shape=(1,), name='toy',
             c=10) -> ArrayDataset:
  """x_train[i] holds i in every entry, so rows can be traced back."""
  x = np.broadcast_to(np.arange(n, dtype=np.float32).reshape(
      (n,) + (1,) * len(shape)), (n,) + shape).copy()
  y = (np.arange(n) % c).astype(np.int32)
  xt = np.zeros((n_test,) + shape, np.float32)
  yt = (np.arange(n_test) % c).astype(np.int32)
  return ArrayDataset(x, y, xt, yt, c, name)


def _ids(x: np.ndarray) -> np.ndarray:
  return x.reshape(len(x), -1)[:, 0].astype(np.int64)


def test_one_dataset_dsfl_split():
  ds = _indexed(1000)
  sp = fd_split(ds, num_public=300, num_private=500, seed=0)
  assert isinstance(sp, FDSplit)
  assert sp.x_public.shape == (300, 1) and sp.x_private.shape == (500, 1)
  pub, priv = _ids(sp.x_public), _ids(sp.x_private)
  assert len(np.intersect1d(pub, priv)) == 0
  assert len(np.unique(pub)) == 300 and len(np.unique(priv)) == 500
  # DS-FL: public first, then private, from one permutation of the training split.
  perm = np.random.default_rng(0).permutation(1000)
  np.testing.assert_array_equal(pub, perm[:300])
  np.testing.assert_array_equal(priv, perm[300:800])
  np.testing.assert_array_equal(sp.y_private, ds.y_train[priv])
  np.testing.assert_array_equal(sp.y_public, ds.y_train[pub])
  np.testing.assert_array_equal(sp.x_test, ds.x_test)
  assert sp.num_classes == 10 and sp.input_shape == (1,)


def test_one_dataset_rest_is_private():
  ds = _indexed(100)
  sp = fd_split(ds, num_public=40, num_private=None, seed=1)
  assert len(sp.y_private) == 60
  ids = np.concatenate([_ids(sp.x_public), _ids(sp.x_private)])
  np.testing.assert_array_equal(np.sort(ids), np.arange(100))


def test_zero_public_allowed():
  sp = fd_split(_indexed(50), num_public=0, num_private=None, seed=0)
  assert sp.x_public.shape == (0, 1) and len(sp.y_private) == 50


def test_determinism_and_seed_dependence():
  ds = _indexed(500)
  a = fd_split(ds, num_public=100, num_private=200, seed=3)
  b = fd_split(ds, num_public=100, num_private=200, seed=3)
  c = fd_split(ds, num_public=100, num_private=200, seed=4)
  np.testing.assert_array_equal(a.x_public, b.x_public)
  np.testing.assert_array_equal(a.x_private, b.x_private)
  assert not np.array_equal(a.x_public, c.x_public)


@pytest.mark.parametrize('num_public,num_private,field', [
    (801, 200, '^num_private='),
    (1000, None, '^num_public='),
    (1001, 1, '^num_public='),
    (-1, 10, '^num_public='),
    (10, -5, '^num_private='),
    (10, 0, '^num_private='),
    (2.5, 10, '^num_public='),
])
def test_one_dataset_impossible(num_public, num_private, field):
  with pytest.raises(ParamError, match=field) as e:
    fd_split(_indexed(1000), num_public=num_public, num_private=num_private,
             seed=0)
  if num_public == 801:
    assert 'the training set has 1000 samples' in str(e.value)


def test_two_datasets_scarlet_split():
  private = _indexed(300, name='priv', shape=(2, 2, 1))
  public = _indexed(1000, name='pub', shape=(2, 2, 1), c=100)
  sp = fd_split(private, num_public=250, num_private=None, seed=7,
                public=public)
  pub = _ids(sp.x_public)
  assert len(np.unique(pub)) == 250  # without replacement
  assert pub.min() >= 0 and pub.max() < 1000
  np.testing.assert_array_equal(sp.y_public, public.y_train[pub])
  # Whole private train split, in order; test from the private data set.
  np.testing.assert_array_equal(_ids(sp.x_private), np.arange(300))
  np.testing.assert_array_equal(sp.y_private, private.y_train)
  assert sp.num_classes == 10 and sp.x_test.shape == (10, 2, 2, 1)
  sub = fd_split(private, num_public=10, num_private=120, seed=7,
                 public=public)
  assert len(np.unique(_ids(sub.x_private))) == 120


def test_two_datasets_shape_mismatch():
  private = _indexed(300, name='cifar10', shape=(2, 2, 3))
  public = _indexed(1000, name='tiny', shape=(4, 4, 3))
  with pytest.raises(DataError) as e:
    fd_split(private, num_public=10, num_private=None, seed=0, public=public)
  msg = str(e.value)
  assert '(4, 4, 3)' in msg and '(2, 2, 3)' in msg


def test_two_datasets_impossible():
  private = _indexed(300)
  public = _indexed(100)
  with pytest.raises(ParamError, match='^num_public=') as e:
    fd_split(private, num_public=101, num_private=None, seed=0, public=public)
  assert 'has 100 samples' in str(e.value)
  with pytest.raises(ParamError, match='^num_private='):
    fd_split(private, num_public=10, num_private=301, seed=0, public=public)


def test_bad_seed():
  with pytest.raises(ParamError, match='^seed='):
    fd_split(_indexed(10), num_public=1, num_private=None, seed=-1)


# ---------------------------------------------------------------- DS-FL's attacks (Sec. 4)
def test_noisy_labels_relabel_each_clients_source_classes():
  y = np.repeat(np.arange(10), 4)                        # 40 rows, 4 of each class
  clients = [np.arange(0, 20), np.arange(20, 40)]        # classes 0-4 and 5-9
  out = splits.noisy_labels(y, clients, 2, 10, seed=3)
  assert out is not y and np.array_equal(y, np.repeat(np.arange(10), 4))   # input untouched
  for k, rows in enumerate(clients):
    drawn = np.random.default_rng([3, 11, k]).permutation(10)[:4]
    src, dst = drawn[:2], drawn[2:]
    for r in rows:
      hit = np.flatnonzero(src == y[r])
      assert out[r] == (dst[hit[0]] if len(hit) else y[r])
  # Every client moves all rows of its 2 source classes that it holds, and no others.
  changed = out != y
  for k, rows in enumerate(clients):
    src = np.random.default_rng([3, 11, k]).permutation(10)[:2]
    assert changed[rows].sum() == 4 * np.isin(src, y[rows]).sum()


def test_noisy_labels_at_most_half_the_classes():
  with pytest.raises(ParamError) as e:
    splits.noisy_labels(np.zeros(4, int), [np.arange(4)], 6, 10, seed=0)
  assert e.value.param == 'classes'


def test_public_noise_rows_join_the_open_set_without_a_class():
  ds = sources.load_source('digits', seed=0)
  split = splits.fd_split(ds, num_public=100, num_private=200, seed=0)
  noise = sources.load_source('synthetic:300', seed=0)
  out = splits.add_public_noise(split, noise, 50, seed=0)
  assert out.x_public.shape == (150,) + split.x_public.shape[1:]
  assert (out.y_public == splits.NO_CLASS).sum() == 50
  # The clean rows are all still there (as a multiset of rows), the private set untouched.
  clean = out.x_public[out.y_public != splits.NO_CLASS]
  key = lambda x: sorted(map(bytes, np.ascontiguousarray(x)))
  assert key(clean) == key(split.x_public)
  assert out.x_private is split.x_private
  with pytest.raises(ParamError):
    splits.add_public_noise(split, noise, 301, seed=0)
