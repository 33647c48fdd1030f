"""Writes any data source as an npz file, for machines without TensorFlow or the raw files.

``python -m fedjax_kd.data.convert SOURCE --out=FILE [--data_dir=DIR]``

``SOURCE`` is anything ``data.source`` accepts (``tfds:cifar10``, ``tfds:imdb_reviews``,
``femnist:<dir>``, ``shakespeare:<dir>``, ...). The file is the Keras layout that
``data.source='npz:FILE'`` reads (``x_train, y_train, x_test, y_test``, plus ``client_id``
for the LEAF sources, ``vocab_size`` for token ids and ``num_classes`` where the source
declares its classes), so a data set prepared once can
be copied to any machine.

TensorFlow Datasets *prepares* data sets with TensorFlow (``tfds build``), while this
library *reads* them without it (``tfds.data_source`` over ``array_record`` files). On a
machine with TensorFlow, either prepare the ``array_record`` files there
(``tfds build cifar10 --file_format=array_record``) and copy the data folder, or run this
converter there: when a tfds data set is not prepared as ``array_record``, it loads it with
``tfds.load`` (which needs TensorFlow and may download) and writes the npz.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import numpy as np

from fedjax_kd.data import sources
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError


def arrays_of(ds: sources.ArrayDataset) -> dict[str, np.ndarray]:
  """The npz arrays of a loaded data set (token ids keep their vocabulary)."""
  out = dict(x_train=ds.x_train, y_train=ds.y_train, x_test=ds.x_test, y_test=ds.y_test)
  if ds.client_ids is not None:
    out['client_id'] = ds.client_ids
  if ds.vocab_size is not None:
    out['vocab_size'] = np.int64(ds.vocab_size)
  if ds.declared_classes:
    out['num_classes'] = np.int64(ds.num_classes)
  return out


def _with_tensorflow(name: str, data_dir: str | None) -> sources.ArrayDataset:
  """``tfds.load`` (TensorFlow) of a tfds image data set, as an `ArrayDataset` of pixels."""
  try:
    import importlib  # pylint: disable=g-import-not-at-top
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
    importlib.import_module('tensorflow')   # tfds.load needs it; fail here with the reason
  except ImportError as e:
    raise DataError(f'tfds:{name} is not prepared in array_record format, and preparing it '
                    f'needs TensorFlow ({e}): run this converter where TensorFlow is '
                    'installed (pip install tensorflow tensorflow-datasets)') from None
  split = {}
  for part in ('train', 'test'):
    x, y = tfds.as_numpy(tfds.load(name, split=part, data_dir=data_dir, batch_size=-1,
                                   as_supervised=True))
    split[part] = (np.asarray(x), np.asarray(y))
  if split['train'][0].dtype.kind in 'OSU':
    raise DataError(f'tfds:{name} holds text: prepare it in array_record format (tfds build '
                    f'{name} --file_format=array_record) and convert that')
  return sources.ArraySource(split['train'][0], split['train'][1], split['test'][0],
                             split['test'][1], name=name).load()


def convert(source: str, out: str, data_dir: str | None = None) -> sources.ArrayDataset:
  """Loads ``source`` and writes it to ``out`` (which must not exist).

  Returns:
    The data set written.

  Raises:
    ParamError, DataError: a bad source, or ``out`` exists.
  """
  if os.path.exists(out):
    raise DataError(f'--out: {out} exists; choose a new file (nothing is overwritten)')
  try:
    ds = sources.load_source(source, data_dir=data_dir)
  except DataError:
    if not source.startswith('tfds:'):
      raise
    ds = _with_tensorflow(source[len('tfds:'):], data_dir)
  np.savez_compressed(out, **arrays_of(ds))
  return ds


def main(argv: Sequence[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog='python -m fedjax_kd.data.convert',
                              description="Write a data source as an npz for data.source='npz:FILE'.")
  p.add_argument('source', help="e.g. tfds:cifar10, femnist:/path/to/leaf/data/femnist/data")
  p.add_argument('--out', required=True, help='the npz file to write (must not exist)')
  p.add_argument('--data_dir', default=None, help='TFDS data directory')
  a = p.parse_args(argv)
  try:
    ds = convert(a.source, a.out, a.data_dir)
  except (ParamError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  print(f'wrote {a.out}: {len(ds.y_train)} train / {len(ds.y_test)} test rows of shape '
        f'{tuple(ds.x_train.shape[1:])} ({ds.x_train.dtype}), {ds.num_classes} classes')
  return 0


if __name__ == '__main__':
  sys.exit(main())
