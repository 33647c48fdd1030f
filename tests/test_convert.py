"""`python -m fedjax_kd.data.convert`: any source to an npz that loads back the same."""

import numpy as np
import pytest

from fedjax_kd.data import convert, sources
from tests.test_leaf import shakespeare_fixture


def _same(a, b):
  for k in ('x_train', 'y_train', 'x_test', 'y_test'):
    np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
    assert getattr(a, k).dtype == getattr(b, k).dtype
  assert (a.num_classes, a.vocab_size, a.bytes_per_sample, a.declared_classes) == (
      b.num_classes, b.vocab_size, b.bytes_per_sample, b.declared_classes)
  if a.client_ids is None:
    assert b.client_ids is None
  else:
    np.testing.assert_array_equal(a.client_ids, b.client_ids)


def test_tfds_image_source_to_npz(tmp_path):
  tfds = pytest.importorskip('tensorflow_datasets')
  out = tmp_path / 'mnist.npz'
  with tfds.testing.mock_data(num_examples=12):
    assert convert.main(['tfds:mnist', f'--out={out}']) == 0
    original = sources.load_source('tfds:mnist')
  back = sources.load_source(f'npz:{out}')
  _same(original, back)          # uint8 pixels, 10 declared classes
  assert back.x_train.dtype == np.uint8 and back.num_classes == 10
  assert convert.main(['tfds:mnist', f'--out={out}']) == 2     # never overwrites


def test_leaf_source_to_npz_keeps_clients_vocabulary_and_classes(tmp_path):
  root = shakespeare_fixture(tmp_path / 'shakespeare')
  out = tmp_path / 'shakespeare.npz'
  assert convert.main([f'shakespeare:{root}', f'--out={out}']) == 0
  original = sources.load_source(f'shakespeare:{root}')
  back = sources.load_source(f'npz:{out}')
  _same(original, back)
  assert (back.num_classes, back.vocab_size) == (81, 81)


def test_bad_source_is_one_line(tmp_path, capsys):
  assert convert.main(['femnist:/nonexistent', f'--out={tmp_path / "x.npz"}']) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith('error: femnist:/nonexistent') and 'missing' in err[0]
