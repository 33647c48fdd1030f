"""In-memory data sources: each data set becomes one `ArrayDataset` (numpy).

Sources (selected by a spec string, see `load_source`):

* ``digits``: the 8x8 handwritten digits (UCI ML hand-written digits,
  Alpaydin & Kaynak 1998) as scikit-learn embeds them, shipped with the
  package (``digits.npz``), no download. A fixed stratified
  1437 / 360 train/test split that never depends on the experiment seed.
* ``synthetic`` / ``synthetic:N``: a small learnable image task for tests
  (per-class random prototype plus Gaussian noise), seeded.
* ``npz:<path>``: the Keras ``*.npz`` layout (keys ``x_train``, ``y_train``,
  ``x_test``, ``y_test``), e.g. ``keras.datasets.mnist``'s ``mnist.npz``. Read
  with ``np.load(path, allow_pickle=False)``; never unpickles anything.
  An optional ``client_id`` array (one integer per training row) gives
  ``data.partition='natural'``: one client per distinct id. A ``vocab_size``
  scalar marks a tokenized text file (int token ids, optionally a bag of words:
  :mod:`fedjax_kd.data.text`, DS-FL's IMDb and Reuters tasks). A ``num_classes``
  scalar declares the task's classes (some may be absent from the training
  split). :mod:`fedjax_kd.data.convert` writes any source in this layout.
* ``femnist:<dir>``, ``shakespeare:<dir>``: LEAF's JSON files
  (:mod:`fedjax_kd.data.leaf`), with each row's writer or speaker as its client id.
* a registered name: arrays in memory, :class:`ArraySource` and
  :func:`register_source`.
* ``tfds:<name>``: a TensorFlow Datasets data set read WITHOUT TensorFlow via
  ``tfds.data_source`` (random-access ``array_record`` files, the TF-free path
  of tensorflow-datasets >= 4.9). The data set must already be prepared in
  ``array_record`` format (``tfds build <name> --file_format=array_record``, in an
  environment with TensorFlow: tfds' builders need it to *prepare* a data set, not to
  read one; then point ``data.data_dir`` at that folder). ``tfds:imdb_reviews``'s
  texts are tokenized as DS-FL's IMDb task (:func:`fedjax_kd.data.text.encode_corpus`).

Integer image sources (MNIST/CIFAR npz files, tfds images) keep their uint8
pixels: the model sees ``x / 255`` (as DS-FL and FedCache 2.0 train), computed
where a batch is gathered (:mod:`fedjax_kd.data.inputs`, one byte per pixel in
memory instead of four). Float sources give float32 inputs (digits and the
synthetic source in [0, 1]). Images are always ``[N, H, W, C]`` (a channel axis
is added to ``[N, H, W]`` grayscale arrays). Labels are int32 ``[N]``.
``data.normalize`` then rescales the inputs (SCARLET's code trains on [-1, 1];
CIFAR training scripts standardise each channel): :func:`input_stats` gives the
per-channel statistics, applied to float inputs once on the host
(:func:`normalize`) and to pixels inside the compiled step
(:class:`fedjax_kd.data.inputs.Normalize`).
"""

from __future__ import annotations

import dataclasses
import os
import zipfile
from typing import Any

import numpy as np

from fedjax_kd.data import inputs as inputs_lib
from fedjax_kd.data import leaf as leaf_lib
from fedjax_kd.data import text as text_lib
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError

__all__ = ['ArrayDataset', 'load_source', 'normalize', 'input_stats', 'SOURCES_ALLOWED']

SOURCES_ALLOWED = ("'digits', 'synthetic[:N]', 'npz:<path>', 'femnist:<dir>', "
                   "'shakespeare:<dir>' or 'tfds:<name>'")

# The digits split is part of the benchmark definition, not of the experiment:
# it uses this fixed seed so that the test set never changes across seeds.

_SYNTHETIC_DEFAULT_N = 600
_SYNTHETIC_NUM_CLASSES = 10
_SYNTHETIC_SHAPE = (8, 8, 1)
_SYNTHETIC_NOISE = 0.2

_NPZ_KEYS = ('x_train', 'y_train', 'x_test', 'y_test')


@dataclasses.dataclass(frozen=True)
class ArrayDataset:
  """A labelled train/test data set held in host memory.

  Attributes:
    x_train: stored inputs (:func:`fedjax_kd.data.inputs.stored_inputs`):
      uint8 pixel images ``[N, H, W, C]`` for integer image sources, else
      float32 images in [0, 1] or features ``[N, D]``.
    y_train: int32 labels ``[N]`` in ``[0, num_classes)``.
    x_test: test inputs, same dtype and trailing shape as ``x_train``.
    y_test: int32 test labels.
    num_classes: number of classes.
    name: the source's name (for logs).
    client_ids: optional int64 ``[N]``: the client (writer, speaker, device...)
      each training row comes from, for ``data.partition='natural'``.
    vocab_size: for token-id inputs (int32 ``[N, L]``): every id is below it; it sizes
      the text models' embedding tables. None for other inputs.
    bytes_per_sample: what one input costs on the wire (the open-data broadcast); None
      counts 4 bytes per input value (float32).
    declared_classes: the source declares its classes (a tfds ClassLabel, LEAF's 62
      characters), so a class absent from the training split is not a numbering gap.
  """
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  name: str
  client_ids: np.ndarray | None = None
  vocab_size: int | None = None
  bytes_per_sample: float | None = None
  declared_classes: bool = False

  @property
  def input_shape(self) -> tuple[int, ...]:
    """Shape of one input (without the batch axis)."""
    return tuple(self.x_train.shape[1:])


@dataclasses.dataclass(frozen=True, eq=False)
class ArraySource:
  """A data source from arrays in memory: your own data, without writing a file.

  Register it under a name and use the name as ``data.source`` (or
  ``data.public_source``)::

    from fedjax_kd.data import sources
    sources.register_source('mine', sources.ArraySource(x_train, y_train, x_test, y_test,
                                                        client_ids=writer_of_each_row))
    config.data.source = 'mine'
    config.data.partition = 'natural'   # one client per distinct client id

  Arrays get the checks and conversions of an ``npz:`` file: uint8 images
  (``[N, H, W]`` or ``[N, H, W, C]``) stay pixels and are scaled to [0, 1] in
  the compiled step; float inputs are used as they are; labels must be integers
  ``0 .. C-1``. ``client_ids`` (one integer per training row) gives the natural
  partition. ``vocab_size`` marks integer inputs ``[N, L]`` as token ids below it (text:
  they reach the model unchanged, for the token models such as ``imdb_lstm``) rather than
  pixels.
  """
  x_train: Any
  y_train: Any
  x_test: Any
  y_test: Any
  client_ids: Any = None
  name: str = 'arrays'
  vocab_size: int | None = None

  def load(self) -> ArrayDataset:
    """The checked :class:`ArrayDataset` of the arrays."""
    if self.vocab_size is not None:
      arrays = dict(x_train=self.x_train, y_train=self.y_train, x_test=self.x_test,
                    y_test=self.y_test, vocab_size=np.asarray(self.vocab_size))
      if self.client_ids is not None:
        arrays['client_id'] = self.client_ids
      return _token_dataset(arrays, f'data source {self.name!r}', self.name)
    return _dataset_of(dict(x_train=np.asarray(self.x_train), y_train=np.asarray(self.y_train),
                            x_test=np.asarray(self.x_test), y_test=np.asarray(self.y_test)),
                       None if self.client_ids is None else np.asarray(self.client_ids),
                       f'data source {self.name!r}', self.name)


_REGISTERED: dict[str, ArraySource] = {}


def register_source(name: str, source: ArraySource) -> None:
  """Makes ``source`` loadable as ``data.source=name`` in this process.

  Registering a name again replaces its source: a config file that registers
  its data is executed more than once (the command line parses it, a sweep's
  workers run it again), and each run builds the arrays anew.

  Args:
    name: letters, digits, ``_`` and ``-``; not a built-in source name.
    source: the :class:`ArraySource`.

  Raises:
    ValueError: a bad name, or a source that is not an ``ArraySource``.
  """
  ok = isinstance(name, str) and name and all(c.isalnum() or c in '_-' for c in name)
  if not ok or name in ('digits', 'synthetic'):
    raise ValueError(f'register_source: name {name!r}: letters, digits, _ and - only, '
                     "not 'digits' or 'synthetic'")
  if not isinstance(source, ArraySource):
    raise ValueError(f'register_source: {name!r}: an ArraySource, got {type(source).__name__}')
  _REGISTERED[name] = source


def unregister_source(name: str) -> None:
  """Removes a source added with :func:`register_source` (no-op when absent)."""
  _REGISTERED.pop(name, None)


def _allowed() -> str:
  extra = ''.join(f", {n!r}" for n in sorted(_REGISTERED))
  return SOURCES_ALLOWED + (f' or a registered source ({extra[2:]})' if extra else '')


def load_source(spec: str,
                *,
                data_dir: str | None = None,
                seed: int = 0,
                field: str = 'spec',
                label_key: str | None = None) -> ArrayDataset:
  """Loads a data set from a spec string.

  Args:
    spec: ``'digits'``, ``'synthetic'``, ``'synthetic:N'``, ``'npz:<path>'`` or
      ``'tfds:<name>'``.
    data_dir: TFDS data directory (``tfds:`` only); None uses TFDS's default.
    seed: seed of the ``synthetic`` source; ignored by the others (the digits
      split is fixed).
    field: config field named in errors.
    label_key: ``tfds:`` only: the ClassLabel feature to use as the label
      (e.g. ``'coarse_label'`` of ``cifar100``: its 20 superclasses, as in
      FedEntOpt's CIFAR-100 runs); None or ``''`` uses the data set's supervised label.

  Returns:
    The `ArrayDataset`.

  Raises:
    ParamError: unknown or malformed spec, or a label_key for a source that
      is not ``tfds:``.
    DataError: the file or data set is missing, corrupt or has a wrong layout.
  """
  if not isinstance(spec, str):
    raise ParamError(field, spec, _allowed())
  if label_key and not spec.startswith('tfds:'):
    raise ParamError('label_key', label_key,
                      "'' (only tfds: sources have several label features)")
  return _load(spec, data_dir, seed, field, label_key)


def check_dataset(ds: ArrayDataset, what: str, labelled: bool = True,
                  declared_classes: bool = False) -> ArrayDataset:
  """Refuses a data set no experiment can use, before anything is built from it.

  :func:`load_source` only loads; an experiment calls this on what it loaded.

  Args:
    ds: the loaded data set.
    what: how errors name it (the config field and source).
    labelled: check the labels as classes to learn (the private source); a public source's
      labels are never trained on, so only its inputs are checked.
    declared_classes: the source declares its classes (a tfds ClassLabel), so a class id
      absent from the training split is a class of the task, not a gap in the numbering,
      and is not refused.

  Returns:
    ``ds``.

  Raises:
    DataError: an empty train or test split; NaN or Inf inputs; fewer than two classes in
      the training split; labels that are not ``0 .. C-1`` with every class in the training
      split (gaps such as {0, 100, ..., 900} are refused, not renumbered: remap them in the
      file so that class ids mean what you expect); test labels the training split lacks.
  """
  for split, x in (('train', ds.x_train), ('test', ds.x_test)):
    if len(x) == 0:
      raise DataError(f'{what}: the {split} split is empty (x_{split} has 0 rows).')
    if inputs_lib.is_pixels(x):
      continue   # integer pixels are always finite
    bad = ~np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if bad.any():
      raise DataError(f'{what}: x_{split} has NaN or Inf inputs in {int(bad.sum())} rows '
                      f'(first: row {int(np.flatnonzero(bad)[0])}).')
  if not labelled:
    return ds
  train = np.unique(ds.y_train)
  if len(train) < 2:
    raise DataError(f'{what}: the training split has {len(train)} class '
                    f'({", ".join(map(str, train))}); at least 2 are needed.')
  if not declared_classes and len(train) != int(train[-1]) + 1:
    missing = sorted(set(range(int(train[-1]) + 1)) - set(train.tolist()))
    shown = ', '.join(map(str, missing[:8])) + (' ...' if len(missing) > 8 else '')
    raise DataError(f'{what}: labels must be 0 .. C-1 with every class in the training '
                    f'split; it has {len(train)} labels from {int(train[0])} to '
                    f'{int(train[-1])}, missing {shown} (remap them to 0 .. {len(train) - 1}).')
  unseen = sorted(set(np.unique(ds.y_test).tolist()) - set(train.tolist()))
  if unseen:
    shown = ', '.join(map(str, unseen[:8])) + (' ...' if len(unseen) > 8 else '')
    raise DataError(f'{what}: the test split has labels the training split lacks '
                    f'({shown}); a model cannot learn them.')
  return ds


def _load(spec: str, data_dir: str | None, seed: int, field: str,
          label_key: str | None) -> ArrayDataset:
  """:func:`load_source` without the checks."""
  if spec in _REGISTERED:
    return _REGISTERED[spec].load()
  if spec == 'digits':
    return _load_digits()
  if spec == 'synthetic' or spec.startswith('synthetic:'):
    n = _SYNTHETIC_DEFAULT_N
    if spec != 'synthetic':
      text = spec[len('synthetic:'):]
      try:
        n = int(text)
      except ValueError:
        raise ParamError(field, spec, SOURCES_ALLOWED + ' with N a positive '
                          'integer') from None
    if n < _SYNTHETIC_NUM_CLASSES:
      raise ParamError(field, spec, f'synthetic:N with N >= '
                        f'{_SYNTHETIC_NUM_CLASSES}')
    return _make_synthetic(n, seed)
  if spec.startswith('npz:'):
    path = spec[len('npz:'):]
    if not path:
      raise ParamError(field, spec, SOURCES_ALLOWED)
    return _load_npz(path)
  task, sep, root = spec.partition(':')
  if sep and task in leaf_lib.TASKS:
    if not root:
      raise ParamError(field, spec, SOURCES_ALLOWED)
    return _load_leaf(task, root)
  if spec.startswith('tfds:'):
    name = spec[len('tfds:'):]
    if not name:
      raise ParamError(field, spec, SOURCES_ALLOWED)
    return _load_tfds(name, data_dir, label_key=label_key or None)
  raise ParamError(field, spec, _allowed())


def input_stats(mode: str, x_train: np.ndarray, mean: tuple[float, ...] = (),
                std: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray] | None:
  """The per-channel ``(mean, std)`` of ``data.normalize`` (None for ``'unit'``).

  Args:
    mode: ``'unit'`` (keep [0, 1]), ``'symmetric'`` (mean 0.5, std 0.5: [-1, 1])
      or ``'standardize'`` (``mean``/``std`` if given, else the per-channel
      statistics of ``x_train``).
    x_train: the training inputs ``[N, ..., C]``: float32 in [0, 1], or uint8
      pixels (their statistics are those of ``x / 255``, from a histogram of the
      pixel values rather than a float copy: :func:`fedjax_kd.data.inputs.pixel_stats`).
    mean: per-channel means for ``'standardize'`` (empty: from ``x_train``).
    std: per-channel standard deviations, same length as ``mean``.

  Returns:
    float32 ``[C]`` arrays ``(mean, std)``, or None.

  Raises:
    ParamError: ``mean`` has another number of channels than the data.
  """
  if mode == 'unit':
    return None
  c = x_train.shape[-1]
  if mode == 'symmetric':
    return np.full(c, 0.5, np.float32), np.full(c, 0.5, np.float32)
  if mean:
    if len(mean) != c:
      raise ParamError('mean', tuple(mean), f'{c} numbers (the inputs have {c} '
                        'channels), or () to use the training set\'s statistics')
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)
  if inputs_lib.is_pixels(x_train):
    mean, std = inputs_lib.pixel_stats(np.asarray(x_train))
  else:
    flat = np.asarray(x_train, np.float64).reshape(-1, c)
    mean, std = flat.mean(0), flat.std(0)
  return mean.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32)


def normalize(x: np.ndarray, stats: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
  """``(x - mean) / std`` per channel (the last axis) of float inputs; ``x`` itself when
  stats is None or ``x`` holds uint8 pixels (normalised where a batch is gathered,
  :class:`fedjax_kd.data.inputs.Normalize`)."""
  return inputs_lib.Normalize.from_stats(stats).prepare(x)


# ----------------------------------------------------------------------------
# Preprocessing shared by the sources.
# ----------------------------------------------------------------------------


def _to_inputs(x: np.ndarray, what: str) -> np.ndarray:
  """Pixels -> uint8, floats -> float32 (:func:`~fedjax_kd.data.inputs.stored_inputs`);
  [N,H,W] -> [N,H,W,1]."""
  x = np.asarray(x)
  if x.dtype == np.bool_ or not (np.issubdtype(x.dtype, np.integer) or
                                 np.issubdtype(x.dtype, np.floating)):
    raise DataError(f'{what}: inputs must be numeric, got dtype {x.dtype}.')
  if x.ndim < 2:
    raise DataError(f'{what}: inputs must have shape [N, ...] with at least 2 '
                    f'axes, got shape {x.shape}.')
  x = inputs_lib.stored_inputs(x)
  if x.ndim == 3:  # [N, H, W] grayscale images.
    x = x[..., None]
  return x


def _to_labels(y: np.ndarray, what: str) -> np.ndarray:
  """Squeezes labels to int32 [N]; rejects non-integer or negative labels."""
  y = np.asarray(y)
  if y.ndim > 1:
    y = y.reshape(y.shape[0], -1)
    if y.shape[1] != 1:
      raise DataError(f'{what}: labels must have shape [N] or [N, 1], got '
                      f'{y.shape}.')
    y = y[:, 0]
  if y.ndim != 1:
    raise DataError(f'{what}: labels must have shape [N], got {y.shape}.')
  if np.issubdtype(y.dtype, np.floating):
    if y.size and not np.all(np.equal(np.mod(y, 1), 0)):
      raise DataError(f'{what}: labels must be integers.')
  elif not np.issubdtype(y.dtype, np.integer):
    raise DataError(f'{what}: labels must be integers, got dtype {y.dtype}.')
  if y.size and y.min() < 0:
    raise DataError(f'{what}: labels must be >= 0, found {y.min()}.')
  return y.astype(np.int32)


def _num_classes(y_train: np.ndarray, y_test: np.ndarray) -> int:
  top = -1
  for y in (y_train, y_test):
    if y.size:
      top = max(top, int(y.max()))
  return top + 1


# ----------------------------------------------------------------------------
# digits
# ----------------------------------------------------------------------------


DIGITS_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'digits.npz')


def _load_digits() -> ArrayDataset:
  """The 8x8 digits: 1797 images, values 0..16 -> /16, fixed split.

  Read from ``digits.npz`` beside this module (49 KB): scikit-learn's copy of
  the UCI data set (``sklearn.datasets.load_digits``: ``images`` as uint8
  0..16, ``labels``) and the split that
  ``train_test_split(arange(1797), test_size=360, stratify=labels,
  random_state=0)`` gives (``train_index``, ``test_index``). Shipping the file
  saves scikit-learn as a dependency and its 1.3 s import at start-up;
  ``tests/test_sources.py`` checks it against scikit-learn where that is
  installed.
  """
  with np.load(DIGITS_FILE, allow_pickle=False) as f:
    images, labels = f['images'], f['labels']
    train_idx, test_idx = f['train_index'].astype(np.int64), f['test_index'].astype(np.int64)
  x = (images.astype(np.float32) / np.float32(16.0))[..., None]
  y = labels.astype(np.int32)
  return ArrayDataset(
      x_train=x[train_idx],
      y_train=y[train_idx],
      x_test=x[test_idx],
      y_test=y[test_idx],
      num_classes=10,
      name='digits')


# ----------------------------------------------------------------------------
# synthetic
# ----------------------------------------------------------------------------


def _make_synthetic(n: int, seed: int) -> ArrayDataset:
  """Class prototypes (uniform 8x8x1 images) plus N(0, 0.2^2) noise, clipped.

  Labels are balanced (``arange(n) % 10`` shuffled). The test set has ``n // 4``
  samples drawn from the same prototypes.

  Args:
    n: number of training samples.
    seed: seed of the prototypes, labels and noise.

  Returns:
    The `ArrayDataset` named ``synthetic:<n>``.
  """
  rng = np.random.default_rng([seed, n])
  c = _SYNTHETIC_NUM_CLASSES
  protos = rng.uniform(0.0, 1.0, size=(c,) + _SYNTHETIC_SHAPE)

  def draw(m: int) -> tuple[np.ndarray, np.ndarray]:
    y = rng.permutation(np.arange(m) % c)
    noise = rng.normal(0.0, _SYNTHETIC_NOISE, size=(m,) + _SYNTHETIC_SHAPE)
    x = np.clip(protos[y] + noise, 0.0, 1.0)
    return x.astype(np.float32), y.astype(np.int32)

  x_train, y_train = draw(n)
  x_test, y_test = draw(max(n // 4, 1))
  return ArrayDataset(x_train, y_train, x_test, y_test, c, f'synthetic:{n}')


# ----------------------------------------------------------------------------
# npz (Keras layout)
# ----------------------------------------------------------------------------


def _load_npz(path: str) -> ArrayDataset:
  """Keras-layout npz: x_train, y_train, x_test, y_test."""
  path = os.path.expanduser(path)
  if not os.path.exists(path):
    raise DataError(f'npz file not found: {path!r}. Provide a Keras-layout '
                    f'npz with keys {list(_NPZ_KEYS)}.')
  if os.path.isdir(path):
    raise DataError(f'npz path is a directory, not a file: {path!r}.')
  arrays: dict[str, np.ndarray] = {}
  try:
    loaded = np.load(path, allow_pickle=False)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    raise DataError(f'cannot read {path!r} as an npz archive (corrupt or not '
                    f'a .npz file): {e}') from e
  if not isinstance(loaded, np.lib.npyio.NpzFile):
    raise DataError(f'{path!r} holds a single array, not an npz archive with '
                    f'keys {list(_NPZ_KEYS)}.')
  with loaded:
    found = sorted(loaded.files)
    missing = [k for k in _NPZ_KEYS if k not in loaded.files]
    if missing:
      raise DataError(f'{path!r} is missing keys {missing}: found {found}, '
                      f'required {list(_NPZ_KEYS)}.')
    optional = tuple(k for k in ('client_id', 'vocab_size', 'bag_of_words', 'num_classes')
                     if k in loaded.files)
    try:
      for k in _NPZ_KEYS + optional:
        arrays[k] = loaded[k]
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
      raise DataError(f'cannot read arrays from {path!r} (corrupt member or '
                      f'pickled object data): {e}') from e
  name = os.path.splitext(os.path.basename(path))[0]
  what = f'npz {path!r}'
  if 'vocab_size' in arrays:
    ds = _token_dataset(arrays, what, name)
  else:
    ds = _dataset_of(arrays, arrays.get('client_id'), what, name)
  if 'num_classes' in arrays:
    # The task's declared classes (a converted tfds or LEAF source): a class absent from the
    # training split is a class of the task, not a gap in the numbering.
    declared = _scalar(arrays, 'num_classes', what, int)
    if declared < ds.num_classes:
      raise DataError(f'{what}: num_classes is {declared} but the labels reach '
                      f'{ds.num_classes - 1}.')
    ds = dataclasses.replace(ds, num_classes=declared, declared_classes=True)
  return ds


def _scalar(arrays: dict[str, np.ndarray], key: str, what: str, kind: type) -> Any:
  v = np.asarray(arrays[key])
  ok = v.ndim == 0 and (np.issubdtype(v.dtype, np.integer) if kind is int
                        else v.dtype == np.bool_ or np.issubdtype(v.dtype, np.integer))
  if not ok:
    raise DataError(f'{what}: {key} must be a scalar {kind.__name__}, got dtype {v.dtype} '
                    f'and shape {v.shape}.')
  return kind(v)


def _token_dataset(arrays: dict[str, np.ndarray], what: str, name: str) -> ArrayDataset:
  """A tokenized text file (:mod:`fedjax_kd.data.text`): int ids [N, L] below vocab_size."""
  vocab = _scalar(arrays, 'vocab_size', what, int)
  bag = _scalar(arrays, 'bag_of_words', what, bool) if 'bag_of_words' in arrays else False
  if vocab < 2:
    raise DataError(f'{what}: vocab_size must be >= 2, got {vocab}.')
  ids = {}
  for split in ('train', 'test'):
    x = np.asarray(arrays[f'x_{split}'])
    if not np.issubdtype(x.dtype, np.integer) or x.ndim != 2:
      raise DataError(f'{what}: x_{split} must be int token ids [N, L] (the file has '
                      f'vocab_size), got dtype {x.dtype} and shape {x.shape}.')
    if x.size and (x.min() < 0 or x.max() >= vocab):
      raise DataError(f'{what}: x_{split} has token ids {int(x.min())}..{int(x.max())}, '
                      f'outside 0..{vocab - 1} (vocab_size {vocab}).')
    ids[split] = x.astype(np.int32)
  if ids['train'].shape[1] != ids['test'].shape[1]:
    raise DataError(f'{what}: x_train rows have {ids["train"].shape[1]} ids but x_test rows '
                    f'have {ids["test"].shape[1]}.')
  y_train = _to_labels(arrays['y_train'], f'{what} y_train')
  y_test = _to_labels(arrays['y_test'], f'{what} y_test')
  for split, x, y in (('train', ids['train'], y_train), ('test', ids['test'], y_test)):
    if len(x) != len(y):
      raise DataError(f'{what}: x_{split} has {len(x)} rows but y_{split} has {len(y)}.')
  per_sample = text_lib.bytes_per_sample(ids['train'].shape[1], vocab, bag)
  if bag:
    x_train, x_test = (text_lib.bag_of_words(ids[s], vocab) for s in ('train', 'test'))
    vocab_out = None       # the model input is the bag of words, not ids
  else:
    x_train, x_test, vocab_out = ids['train'], ids['test'], vocab
  client_ids = arrays.get('client_id')
  if client_ids is not None:
    client_ids = _client_ids(client_ids, len(y_train), what)
  return ArrayDataset(x_train, y_train, x_test, y_test, _num_classes(y_train, y_test), name,
                      client_ids=client_ids, vocab_size=vocab_out,
                      bytes_per_sample=per_sample)


def _load_leaf(task: str, root: str) -> ArrayDataset:
  """LEAF's FEMNIST or Shakespeare JSON folders (:mod:`fedjax_kd.data.leaf`)."""
  try:
    d = leaf_lib.load(task, root)
  except leaf_lib.LeafError as e:
    raise DataError(f'{task}:{root}: {e}') from None
  per_sample = None
  if d['vocab_size']:
    per_sample = text_lib.bytes_per_sample(d['x_train'].shape[1], d['vocab_size'], False)
  return ArrayDataset(d['x_train'], d['y_train'].astype(np.int32), d['x_test'],
                      d['y_test'].astype(np.int32), d['num_classes'], task,
                      client_ids=d['client_id'], vocab_size=d['vocab_size'],
                      bytes_per_sample=per_sample, declared_classes=True)


def _dataset_of(arrays: dict[str, np.ndarray], client_ids: np.ndarray | None, what: str,
                name: str) -> ArrayDataset:
  """Checks and converts Keras-layout arrays (and optional per-row client ids)."""
  x_train = _to_inputs(arrays['x_train'], f'{what} x_train')
  x_test = _to_inputs(arrays['x_test'], f'{what} x_test')
  y_train = _to_labels(arrays['y_train'], f'{what} y_train')
  y_test = _to_labels(arrays['y_test'], f'{what} y_test')
  for split, x, y in (('train', x_train, y_train), ('test', x_test, y_test)):
    if len(x) != len(y):
      raise DataError(f'{what}: x_{split} has {len(x)} rows but y_{split} has '
                      f'{len(y)}.')
  if x_train.shape[1:] != x_test.shape[1:]:
    raise DataError(f'{what}: x_train rows have shape {x_train.shape[1:]} but '
                    f'x_test rows have shape {x_test.shape[1:]}.')
  if client_ids is not None:
    client_ids = _client_ids(client_ids, len(y_train), what)
  return ArrayDataset(x_train, y_train, x_test, y_test,
                      _num_classes(y_train, y_test), name, client_ids=client_ids)


def _client_ids(client_ids: Any, n: int, what: str) -> np.ndarray:
  client_ids = np.asarray(client_ids)
  if (client_ids.ndim != 1 or len(client_ids) != n
      or not np.issubdtype(client_ids.dtype, np.integer)):
    raise DataError(f'{what}: client_id must be one integer per training row ({n}'
                    f'), got dtype {client_ids.dtype} and shape {client_ids.shape}.')
  return client_ids.astype(np.int64)


# ----------------------------------------------------------------------------
# tfds (TF-free data_source path)
# ----------------------------------------------------------------------------


def _short(message: str, limit: int = 300) -> str:
  message = ' '.join(message.split())
  return message if len(message) <= limit else message[:limit] + '...'


def _tfds_hint(name: str) -> str:
  return (f'Preparing needs TensorFlow, reading does not: where TensorFlow is installed '
          f'(pip install tensorflow tensorflow-datasets) run `tfds build {name} '
          f'--file_format=array_record` and point data.data_dir at that data folder, or run '
          f'`python -m fedjax_kd.data.convert tfds:{name} --out={name}.npz` there and use '
          f"'npz:{name}.npz'.")


def _read_all(source: Any, keys: tuple[str, str],
              what: str) -> tuple[np.ndarray, np.ndarray]:
  """Reads every record of a TFDS random-access data source into arrays."""
  n = len(source)
  xs: list[Any] = []
  ys: list[Any] = []
  chunk = 1024
  batched = hasattr(source, '__getitems__')
  start = 0
  while start < n:
    idx = list(range(start, min(start + chunk, n)))
    records = None
    if batched:
      try:
        records = source.__getitems__(idx)
      except (TypeError, NotImplementedError, AttributeError):
        batched = False  # e.g. tfds.testing.mock_data's sources.
    if records is None:
      records = [source[i] for i in idx]
    for r in records:
      try:
        xs.append(np.asarray(r[keys[0]]))
        ys.append(np.asarray(r[keys[1]]))
      except (KeyError, TypeError) as e:
        raise DataError(f'{what}: records lack the features {keys}.') from e
    start += chunk
  if n == 0:
    raise DataError(f'{what}: the split is empty.')
  try:
    x = np.stack(xs)
  except ValueError as e:
    raise DataError(f'{what}: inputs have different shapes; only fixed-shape '
                    f'features can be stacked.') from e
  return x, np.asarray(ys)


def _class_label_features(info: Any) -> list[str]:
  """Names of the top-level ClassLabel features of a TFDS ``DatasetInfo``."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    features = dict(info.features.items())
  except (AttributeError, TypeError):
    return []
  return sorted(k for k, f in features.items()
                if isinstance(f, tfds.features.ClassLabel))


def _load_tfds(name: str, data_dir: str | None,
               label_key: str | None = None) -> ArrayDataset:
  """TFDS ``name`` via ``tfds.data_source`` (array_record, no TensorFlow).

  Args:
    name: TFDS data set name, e.g. ``'cifar100'``.
    data_dir: TFDS data directory; None uses TFDS's default.
    label_key: the ClassLabel feature read as the label; None uses the
      supervised keys' label (``'label'`` if the data set declares none).

  Returns:
    The `ArrayDataset`, num_classes from the label feature.

  Raises:
    DataError: the data set cannot be opened or read, or lacks ``label_key``.
  """
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataError(f"'tfds:{name}' needs tensorflow-datasets: pip install "
                    f"'fedjax_kd[tfds]'; or use 'npz:<path>'.") from e

  splits = {}
  for split in ('train', 'test'):
    try:
      # download=False: never reach for the network from inside a run; a
      # missing or TFRecord-only preparation becomes a DataError with a hint.
      splits[split] = tfds.data_source(
          name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # pylint: disable=broad-except
      # TFDS raises many types here (DatasetNotFoundError, AssertionError,
      # NotImplementedError for TFRecord-only data, FileNotFoundError...).
      raise DataError(
          f"cannot open TFDS data set {name!r} split {split!r} (data_dir="
          f"{data_dir!r}) without TensorFlow: {type(e).__name__}: "
          f"{_short(str(e))} {_tfds_hint(name)}"
      ) from e

  info = getattr(splits['train'], 'dataset_info', None)
  if info is None:
    try:
      info = tfds.builder(name, data_dir=data_dir).info
    except Exception as e:  # pylint: disable=broad-except
      raise DataError(f'cannot read the metadata of TFDS data set {name!r}. '
                      f'{_tfds_hint(name)}') from e
  keys = tuple(info.supervised_keys or ()) or ('image', 'label')
  if len(keys) != 2 or not all(isinstance(k, str) for k in keys):
    keys = ('image', 'label')
  if label_key:
    available = _class_label_features(info)
    if label_key not in available:
      raise DataError(f'data.label_key={label_key!r}: TFDS data set {name!r} '
                      f'has no ClassLabel feature {label_key!r}; available: '
                      f'{available}.')
    keys = (keys[0], label_key)
  try:
    num_classes = int(info.features[keys[1]].num_classes)
  except (KeyError, AttributeError, TypeError) as e:
    raise DataError(f'TFDS data set {name!r}: feature {keys[1]!r} is not a '
                    f'ClassLabel, cannot infer num_classes.') from e

  raw = {split: _read_all(source, keys, f'tfds:{name} {split}')
         for split, source in splits.items()}
  vocab = per_sample = None
  if raw['train'][0].dtype.kind in 'OSU':
    # A text feature (imdb_reviews): DS-FL's IMDb preprocessing, the vocabulary from the
    # training texts (the 20,000 most frequent words, the first 200 of each text).
    x_train, x_test = text_lib.encode_corpus(raw['train'][0], raw['test'][0])
    raw = {'train': (x_train, raw['train'][1]), 'test': (x_test, raw['test'][1])}
    vocab = text_lib.IMDB_NUM_WORDS
    per_sample = text_lib.bytes_per_sample(x_train.shape[1], vocab, False)
  out = {}
  for split, (x, y) in raw.items():
    what = f'tfds:{name} {split}'
    out[split] = (x if vocab else _to_inputs(x, what), _to_labels(y, what))
  y_max = _num_classes(out['train'][1], out['test'][1])
  if y_max > num_classes:
    raise DataError(f'tfds:{name}: labels reach {y_max - 1} but the data set '
                    f'declares {num_classes} classes.')
  return ArrayDataset(out['train'][0], out['train'][1], out['test'][0],
                      out['test'][1], num_classes, name, vocab_size=vocab,
                      bytes_per_sample=per_sample, declared_classes=True)
