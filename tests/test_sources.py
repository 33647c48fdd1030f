"""Tests for fedjax_kd.data.sources."""

from __future__ import annotations


import numpy as np
import pytest

from fedjax_kd.data.inputs import as_float
from fedjax_kd.data.sources import ArrayDataset, load_source
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError



from tests.conftest import MNIST_COUNTS, mnist_path as _mnist_path


def _write_keras_npz(path, n_train=50, n_test=20, seed=0, **overrides):
  rng = np.random.default_rng(seed)
  arrays = dict(
      x_train=rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8),
      y_train=rng.integers(0, 10, size=n_train).astype(np.uint8),
      x_test=rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8),
      y_test=rng.integers(0, 10, size=n_test).astype(np.uint8))
  arrays.update(overrides)
  arrays = {k: v for k, v in arrays.items() if v is not None}
  np.savez(path, **arrays)
  return arrays


# ----------------------------------------------------------------------------
# digits
# ----------------------------------------------------------------------------


@pytest.mark.slow
def test_digits():
  sk_datasets = pytest.importorskip('sklearn.datasets')
  ds = load_source('digits')
  assert isinstance(ds, ArrayDataset)
  assert ds.name == 'digits' and ds.num_classes == 10
  assert ds.x_train.shape == (1437, 8, 8, 1)
  assert ds.x_test.shape == (360, 8, 8, 1)
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0
  assert ds.x_test.min() >= 0.0 and ds.x_test.max() <= 1.0
  # Values are k/16.
  np.testing.assert_allclose(ds.x_train * 16, np.round(ds.x_train * 16))
  full = np.bincount(sk_datasets.load_digits().target, minlength=10)
  np.testing.assert_array_equal(
      np.bincount(ds.y_train, minlength=10) +
      np.bincount(ds.y_test, minlength=10), full)
  # Stratified: every class has 35-37 test samples.
  test_counts = np.bincount(ds.y_test, minlength=10)
  assert test_counts.min() >= 35 and test_counts.max() <= 37
  # Train and test partition the 1797 images (as multisets of pixel rows).
  images = np.asarray(sk_datasets.load_digits().images, np.float32) / 16
  ours = np.concatenate([ds.x_train, ds.x_test])[..., 0].reshape(1797, -1)
  order = lambda a: a[np.lexsort(a.T[::-1])]
  np.testing.assert_array_equal(order(ours), order(images.reshape(1797, -1)))


def test_shipped_digits_equal_scikit_learns_load_and_split():
  """digits.npz holds exactly scikit-learn's images and the stratified split its
  train_test_split(test_size=360, random_state=0) gives, in the same order."""
  sk_datasets = pytest.importorskip('sklearn.datasets')
  model_selection = pytest.importorskip('sklearn.model_selection')
  bunch = sk_datasets.load_digits()
  x = (np.asarray(bunch.images, np.float32) / np.float32(16.0))[..., None]
  y = np.asarray(bunch.target, np.int32)
  train_idx, test_idx = model_selection.train_test_split(
      np.arange(len(y)), test_size=360, stratify=y, random_state=0, shuffle=True)
  ds = load_source('digits')
  np.testing.assert_array_equal(ds.x_train, x[train_idx])
  np.testing.assert_array_equal(ds.y_train, y[train_idx])
  np.testing.assert_array_equal(ds.x_test, x[test_idx])
  np.testing.assert_array_equal(ds.y_test, y[test_idx])


def test_digits_split_fixed_regardless_of_seed():
  a = load_source('digits', seed=0)
  b = load_source('digits', seed=123)
  np.testing.assert_array_equal(a.x_test, b.x_test)
  np.testing.assert_array_equal(a.y_train, b.y_train)


# ----------------------------------------------------------------------------
# synthetic
# ----------------------------------------------------------------------------


def test_synthetic_shapes_and_seed():
  ds = load_source('synthetic')
  assert ds.x_train.shape == (600, 8, 8, 1)
  assert ds.x_test.shape == (150, 8, 8, 1)
  assert ds.num_classes == 10
  np.testing.assert_array_equal(np.bincount(ds.y_train), np.full(10, 60))
  assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int32
  assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0
  small = load_source('synthetic:200', seed=3)
  assert small.x_train.shape[0] == 200 and small.x_test.shape[0] == 50
  again = load_source('synthetic:200', seed=3)
  np.testing.assert_array_equal(small.x_train, again.x_train)
  other = load_source('synthetic:200', seed=4)
  assert not np.array_equal(small.x_train, other.x_train)


def test_synthetic_is_learnable():
  ds = load_source('synthetic:600', seed=0)
  centroids = np.stack([
      ds.x_train[ds.y_train == c].reshape(-1, 64).mean(0) for c in range(10)
  ])
  d = ((ds.x_test.reshape(-1, 1, 64) - centroids[None])**2).sum(-1)
  acc = (d.argmin(1) == ds.y_test).mean()
  assert acc > 0.9


@pytest.mark.parametrize('spec', ['synthetic:', 'synthetic:abc', 'synthetic:5',
                                  'synthetic:-10'])
def test_synthetic_bad_size(spec):
  with pytest.raises(ParamError, match='^spec='):
    load_source(spec)


# ----------------------------------------------------------------------------
# npz
# ----------------------------------------------------------------------------


def test_npz_round_trip(tmp_path):
  path = tmp_path / 'mnist_like.npz'
  arrays = _write_keras_npz(path)
  ds = load_source(f'npz:{path}')
  assert ds.x_train.shape == (50, 28, 28, 1)
  assert ds.x_test.shape == (20, 28, 28, 1)
  # uint8 pixels are stored as they are (one byte each); their model inputs are x / 255.
  assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
  np.testing.assert_array_equal(ds.x_train[..., 0], arrays['x_train'])
  np.testing.assert_array_equal(as_float(ds.x_train)[..., 0],
                                arrays['x_train'].astype(np.float32) / np.float32(255))
  np.testing.assert_array_equal(ds.y_test, arrays['y_test'])
  expected_c = int(max(arrays['y_train'].max(), arrays['y_test'].max())) + 1
  assert ds.num_classes == expected_c
  assert ds.name == 'mnist_like'


def test_npz_column_labels_and_rgb(tmp_path):
  path = tmp_path / 'rgb.npz'
  rng = np.random.default_rng(1)
  _write_keras_npz(
      path,
      x_train=rng.integers(0, 256, (8, 4, 4, 3), dtype=np.uint8),
      y_train=np.arange(8).reshape(8, 1).astype(np.int64),
      x_test=rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8),
      y_test=np.array([[1], [11]]))
  ds = load_source(f'npz:{path}')
  assert ds.x_train.shape == (8, 4, 4, 3)
  assert ds.y_train.shape == (8,) and ds.y_train.dtype == np.int32
  assert ds.num_classes == 12  # max label over train AND test, plus one


def test_npz_missing_file(tmp_path):
  path = tmp_path / 'nope.npz'
  with pytest.raises(DataError, match='nope.npz'):
    load_source(f'npz:{path}')


def test_npz_corrupt_file(tmp_path):
  path = tmp_path / 'garbage.npz'
  path.write_bytes(b'this is not a zip archive \x00\x01\x02' * 10)
  with pytest.raises(DataError, match='garbage.npz'):
    load_source(f'npz:{path}')
  truncated = tmp_path / 'truncated.npz'
  _write_keras_npz(tmp_path / 'full.npz')
  truncated.write_bytes((tmp_path / 'full.npz').read_bytes()[:500])
  with pytest.raises(DataError):
    load_source(f'npz:{truncated}')


def test_npz_single_array_file(tmp_path):
  path = tmp_path / 'single.npy'
  np.save(path, np.zeros(3))
  with pytest.raises(DataError, match='single array'):
    load_source(f'npz:{path}')


def test_npz_pickled_object_array_rejected(tmp_path):
  path = tmp_path / 'obj.npz'
  _write_keras_npz(path, y_test=np.array([object(), 1], dtype=object))
  with pytest.raises(DataError):
    load_source(f'npz:{path}')


def test_npz_missing_keys(tmp_path):
  path = tmp_path / 'partial.npz'
  _write_keras_npz(path, x_test=None, y_test=None)
  with pytest.raises(DataError) as e:
    load_source(f'npz:{path}')
  msg = str(e.value)
  assert "'x_test'" in msg and "'y_test'" in msg
  assert "found ['x_train', 'y_train']" in msg
  assert 'required' in msg


def test_npz_length_mismatch(tmp_path):
  path = tmp_path / 'mismatch.npz'
  _write_keras_npz(path, y_train=np.zeros(49, np.uint8))
  with pytest.raises(DataError, match='x_train has 50 rows but y_train has 49'):
    load_source(f'npz:{path}')


def test_unknown_spec():
  with pytest.raises(ParamError, match='^spec=') as e:
    load_source('mnist')
  assert "'npz:<path>'" in str(e.value)
  with pytest.raises(ParamError, match='data.public_source'):
    load_source('csv:foo', field='data.public_source')
  with pytest.raises(ParamError):
    load_source('npz:')


def test_real_mnist_npz():
  path = _mnist_path()
  if not path.exists():
    pytest.skip(f'{path} not present')
  ds = load_source(f'npz:{path}')
  assert ds.x_train.shape == (60000, 28, 28, 1)
  assert ds.x_train.dtype == np.uint8   # 47 MB, not 188 MB of float32
  assert ds.x_test.shape == (10000, 28, 28, 1)
  assert ds.num_classes == 10
  assert ds.x_train.min() == 0 and ds.x_train.max() == 255
  np.testing.assert_array_equal(np.bincount(ds.y_train), MNIST_COUNTS)


# ----------------------------------------------------------------------------
# tfds (TF-free data_source path)
# ----------------------------------------------------------------------------


def test_tfds_mock_mnist():
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=12):
    ds = load_source('tfds:mnist')
  assert ds.name == 'mnist' and ds.num_classes == 10
  assert ds.x_train.shape == (12, 28, 28, 1)
  assert ds.x_test.shape == (12, 28, 28, 1)
  assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
  x = as_float(ds.x_train)
  assert x.dtype == np.float32 and 0.0 <= x.min() and x.max() <= 1.0
  assert ds.y_train.min() >= 0 and ds.y_train.max() < 10


def test_tfds_missing_dataset(tmp_path):
  pytest.importorskip('tensorflow_datasets')
  with pytest.raises(DataError, match='tfds build'):
    load_source('tfds:mnist', data_dir=str(tmp_path))
  with pytest.raises(DataError, match='tfds build'):
    load_source('tfds:no_such_dataset_xyz', data_dir=str(tmp_path))


def test_tfds_mock_cifar100_coarse_label():
  # FedEntOpt trains on CIFAR-100's 20 superclasses: tfds cifar100's 'coarse_label'.
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=12):
    fine = load_source('tfds:cifar100')
    coarse = load_source('tfds:cifar100', label_key='coarse_label')
    same = load_source('tfds:cifar100', label_key='label')
  assert fine.num_classes == 100 and same.num_classes == 100
  assert coarse.num_classes == 20
  assert coarse.x_train.shape == (12, 32, 32, 3) and coarse.x_test.shape == (12, 32, 32, 3)
  assert coarse.y_train.dtype == np.int32
  for y in (coarse.y_train, coarse.y_test):
    assert y.min() >= 0 and y.max() < 20
  np.testing.assert_array_equal(coarse.x_train, fine.x_train)  # same records, other labels


def test_tfds_label_key_errors():
  tfds = pytest.importorskip('tensorflow_datasets')
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(DataError) as err:
      load_source('tfds:cifar100', label_key='superclass')
  msg = str(err.value)
  assert 'data.label_key' in msg and 'cifar100' in msg and 'superclass' in msg
  assert "'coarse_label'" in msg and "'label'" in msg  # the available ClassLabel features
  for spec in ('digits', 'synthetic:40'):
    with pytest.raises(ParamError) as cerr:
      load_source(spec, label_key='coarse_label')
    assert cerr.value.param == 'label_key' and cerr.value.value == 'coarse_label'
    assert 'only tfds:' in str(cerr.value)
  # An empty label_key means the default label everywhere.
  assert load_source('digits', label_key='').num_classes == 10


def test_check_dataset_by_hand():
  """The experiment's checks on a loaded data set (load_source itself only loads)."""
  from fedjax_kd.data.sources import ArrayDataset, check_dataset
  x = np.zeros((6, 2, 2, 1), np.float32)
  ds = lambda y, yt, **kw: ArrayDataset(kw.get('x', x), np.array(y), kw.get('xt', x[:2]),
                                       np.array(yt), 10, 't')
  assert check_dataset(ds([0, 1, 2, 0, 1, 2], [0, 2]), 'd') is not None
  # {0, 5, 9}: a gap in the numbering of an npz; a tfds ClassLabel declares its classes.
  with pytest.raises(DataError, match='missing 1, 2, 3, 4, 6, 7, 8 '):
    check_dataset(ds([0, 5, 9, 0, 5, 9], [0, 9]), 'd')
  check_dataset(ds([0, 5, 9, 0, 5, 9], [0, 9]), 'd', declared_classes=True)
  with pytest.raises(DataError, match=r'labels the training split lacks \(3\)'):
    check_dataset(ds([0, 1, 2, 0, 1, 2], [0, 3]), 'd', declared_classes=True)
  with pytest.raises(DataError, match='has 1 class'):
    check_dataset(ds([4] * 6, [4]), 'd', declared_classes=True)
  bad = x.copy()
  bad[4, 1, 0, 0] = np.inf
  with pytest.raises(DataError, match=r'x_train has NaN or Inf inputs in 1 rows \(first: row 4\)'):
    check_dataset(ds([0, 1, 2, 0, 1, 2], [0, 2], x=bad), 'd')
  with pytest.raises(DataError, match='the test split is empty'):
    check_dataset(ds([0, 1, 2, 0, 1, 2], [], xt=x[:0]), 'd')
  # A public source: only its inputs count (its labels are never trained on).
  check_dataset(ds([7] * 6, [3, 3]), 'p', labelled=False)
  with pytest.raises(DataError, match='p: x_test'):
    check_dataset(ds([7] * 6, [3, 3], xt=bad[3:5]), 'p', labelled=False)
