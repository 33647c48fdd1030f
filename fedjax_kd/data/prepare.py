"""A data spec to a partitioned data set, in one call: load, check, normalise, split, partition.

The steps an experiment takes before any model exists, in order:

1. **load** the private source (and the public one, where the task has its own) and **check**
   each (:func:`fedjax_kd.data.sources.load_source`, :func:`~fedjax_kd.data.sources.check_dataset`);
2. **input kind**: token-id sources (text) take no normalisation or image augmentation, and a
   public source must be of the private one's kind;
3. **normalise**: one per-channel affine map from the private training set for the private,
   public and test inputs alike (float inputs are mapped here, once; uint8 pixels stay pixels,
   one byte each, and the kernels map them where they gather a batch);
4. **split** into the private pool and the open (public) set (DS-FL's I^p / I^o,
   :func:`fedjax_kd.data.splits.fd_split`);
5. **partition** the private pool over the clients (:func:`fedjax_kd.data.partition.partition`),
   with a per-client validation split and per-client test splits where asked.

What it reads is :class:`DataRequest`, the ``data.*`` options by name; the config layer's
``DataSpec`` is one (the data layer imports no config class). Errors name the option
(``alpha``, ``num_public``, ...) or
``num_clients`` / ``seed`` as :class:`~fedjax_kd.ops.errors.ParamError`; the config layer maps
them to config fields. A bad file is a :class:`~fedjax_kd.errors.DataError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Iterator, Mapping, Protocol

import numpy as np

from fedjax_kd.data import inputs as inputs_lib
from fedjax_kd.data import partition as partition_lib
from fedjax_kd.data import sources, splits
from fedjax_kd.errors import DataError
from fedjax_kd.ops.errors import ParamError


@dataclasses.dataclass(frozen=True)
class PreparedData:
  """A partitioned data set on the host, ready to be placed on the device.

  Attributes:
    split: the private pool, open set and test set (:class:`fedjax_kd.data.splits.FDSplit`).
    client_indices: one index array into ``split``'s private pool per client (its training
      rows; without the validation rows where there are some).
    val_indices: per-client validation rows, or None.
    test_indices: per-client test rows (into the test set), or None.
    normalize: the input map of every phase.
    stats: the per-channel ``(mean, std)`` it came from, or None (``'unit'``).
    bytes_per_public_sample: what one open sample costs on the wire (float32 values, or a
      text source's own size).
    vocab_size: the vocabulary of token-id inputs, None for other inputs.
  """
  split: splits.FDSplit
  client_indices: tuple[np.ndarray, ...]
  val_indices: tuple[np.ndarray, ...] | None
  test_indices: tuple[np.ndarray, ...] | None
  normalize: inputs_lib.Normalize
  stats: tuple[np.ndarray, np.ndarray] | None
  bytes_per_public_sample: float
  vocab_size: int | None


class DataRequest(Protocol):
  """The ``data.*`` options :func:`prepare` reads (``fedjax_kd.config.spec.DataSpec`` declares
  them: their defaults, checks and docs)."""
  source: str
  public_source: str
  data_dir: str
  label_key: str
  num_public: int
  num_private: int
  public_noise_source: str
  num_public_noise: int
  partition: str
  alpha: float
  shards_per_client: int
  classes_per_client: int
  dominant_fraction: float
  min_size: int
  noisy_classes: int
  val_fraction: float
  per_client_test: bool
  normalize: str
  mean: tuple[float, ...]
  std: tuple[float, ...]
  augment: str


@contextlib.contextmanager
def _named(names: Mapping[str, str]) -> Iterator[None]:
  """A library's parameter errors under this module's names (the ``data.*`` options)."""
  try:
    yield
  except ParamError as e:
    raise ParamError(names.get(e.param, e.param), e.value, e.allowed) from None


def prepare(spec: DataRequest, *, num_clients: int, seed: int) -> PreparedData:
  """Loads, checks, normalises, splits and partitions the data a spec describes.

  Args:
    spec: the data options.
    num_clients: K, the clients the private pool is partitioned over.
    seed: the experiment's seed (loading, the split, the partition).

  Returns:
    The :class:`PreparedData`.

  Raises:
    ParamError: an option the data cannot satisfy, named by its ``data.*`` option
      (``source``, ``num_public``, ``alpha``, ...), ``num_clients`` or ``seed``.
    DataError: a source that is missing, damaged or of the wrong layout.
  """
  data_dir = spec.data_dir or None
  dataset = sources.load_source(spec.source, data_dir=data_dir, seed=seed, field='source',
                                label_key=spec.label_key or None)
  sources.check_dataset(dataset, f'the private source {spec.source!r}',
                        declared_classes=dataset.declared_classes)
  public = None
  if spec.public_source:
    public = sources.load_source(spec.public_source, data_dir=data_dir, seed=seed,
                                 field='public_source')
    sources.check_dataset(public, f'the public source {spec.public_source!r}', labelled=False)
  vocab_size = _input_kind(spec, dataset, public)
  shown = public if public is not None else dataset
  per_sample = shown.bytes_per_sample or float(math.prod(shown.x_train.shape[1:]) * 4)
  stats = sources.input_stats(spec.normalize, dataset.x_train, spec.mean, spec.std)
  normalize = inputs_lib.Normalize.from_stats(stats)
  if stats is not None:
    norm = lambda ds: dataclasses.replace(ds, x_train=normalize.prepare(ds.x_train),
                                          x_test=normalize.prepare(ds.x_test))
    dataset = norm(dataset)
    if public is not None:
      if public.x_train.shape[-1] != dataset.x_train.shape[-1]:
        raise DataError(f'the public source {spec.public_source!r} has '
                        f'{public.x_train.shape[-1]} channels, but the private source '
                        f'{spec.source!r} has {dataset.x_train.shape[-1]}')
      public = norm(public)
  noise = None
  if spec.num_public_noise:
    noise = sources.load_source(spec.public_noise_source, data_dir=data_dir, seed=seed,
                                field='public_noise_source')
    sources.check_dataset(noise, f'the open-set noise source {spec.public_noise_source!r}',
                          labelled=False)
    if stats is not None:
      noise = norm(noise)
  split = splits.fd_split(dataset, num_public=spec.num_public,
                          num_private=None if spec.num_private < 0 else spec.num_private,
                          seed=seed, public=public)
  if noise is not None:
    with _named({'num_noise': 'num_public_noise', 'noise': 'public_noise_source'}):
      split = splits.add_public_noise(split, noise, spec.num_public_noise, seed)
  # The split holds its own rows now; the loaded training arrays go before anything is placed
  # on the device, so at most two copies of the private images ever coexist (briefly).
  del dataset, public, noise
  with _named({'name': 'partition', 'fraction': 'dominant_fraction'}):
    part = partition_lib.partition(
        spec.partition, split.y_private, num_clients, client_ids=split.client_ids_private,
        num_classes=split.num_classes, seed=seed, alpha=spec.alpha,
        shards_per_client=spec.shards_per_client, classes_per_client=spec.classes_per_client,
        dominant_fraction=spec.dominant_fraction, min_size=spec.min_size)
  if spec.noisy_classes:
    with _named({'classes': 'noisy_classes'}):
      split = dataclasses.replace(split, y_private=splits.noisy_labels(
          split.y_private, part.client_indices, spec.noisy_classes, split.num_classes, seed))
  client_indices, val_indices = part.client_indices, None
  if spec.val_fraction > 0:
    with _named({'fraction': 'val_fraction'}):
      client_indices, val_indices = splits.client_validation_split(
          part.client_indices, spec.val_fraction, seed)
  test_indices = None
  if spec.per_client_test:
    with _named({'name': 'partition'}):
      test_indices = partition_lib.partition_test_like(
          spec.partition, part, split.y_test, num_clients, num_classes=split.num_classes,
          seed=seed)
  return PreparedData(split=split, client_indices=tuple(client_indices),
                      val_indices=None if val_indices is None else tuple(val_indices),
                      test_indices=None if test_indices is None else tuple(test_indices),
                      normalize=normalize, stats=stats, bytes_per_public_sample=per_sample,
                      vocab_size=vocab_size)


def _input_kind(spec: DataRequest, dataset: sources.ArrayDataset,
                public: sources.ArrayDataset | None) -> int | None:
  """The vocabulary size of token-id inputs (None for others), after refusing what cannot
  apply to token ids: a public source of another kind or a larger vocabulary, input
  normalisation, image augmentation."""
  vocab = dataset.vocab_size
  if public is not None and public.vocab_size != vocab and (vocab is None or
                                                            public.vocab_size is None or
                                                            public.vocab_size > vocab):
    raise ParamError('public_source', spec.public_source,
                     f'a source of the same input kind as the private source (token ids '
                     f'below {vocab})' if vocab else 'a source of the same input kind as the '
                     'private source (not token ids)')
  if vocab is None:
    return None
  if spec.normalize != 'unit':
    raise ParamError('normalize', spec.normalize,
                     "'unit' (the source holds token ids, which are not normalised)")
  if spec.augment != 'none':
    raise ParamError('augment', spec.augment, "'none' (the source holds token ids, not images)")
  return int(vocab)
