"""Builds an experiment from a validated spec: data, partition, models, algorithm.

Everything that can fail on bad input (data files, split sizes, partition
feasibility, model/input compatibility) runs here, before any compilation.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile

import jax
import numpy as np
import optax

from fedjax_kd import algorithms
from fedjax_kd import fields
from fedjax_kd import selection as selection_lib
from fedjax_kd.algorithms.base import Algorithm, Context
from fedjax_kd.core.federation import Federation, build_federated_data
from fedjax_kd.core.store import ClientStore
from fedjax_kd.data import partition as partition_lib
from fedjax_kd.data import inputs as inputs_lib
from fedjax_kd.data import sources, splits
from fedjax_kd.errors import ConfigError, DataError
from fedjax_kd.models import registry
from fedjax_kd.ops import selection as selection_ops
from fedjax_kd.spec import ExperimentSpec, OptimSpec


def make_optimizer(o: OptimSpec) -> optax.GradientTransformation:
  """SGD (optionally with momentum) or Adam, with optional L2 weight decay."""
  if o.optimizer == 'sgd':
    tx = optax.sgd(o.learning_rate, momentum=o.momentum or None)
  else:
    tx = optax.adam(o.learning_rate)
  if o.weight_decay:
    tx = optax.chain(optax.add_decayed_weights(o.weight_decay), tx)
  return tx


@dataclasses.dataclass(frozen=True)
class Experiment:
  spec: ExperimentSpec
  ctx: Context
  algorithm: Algorithm


def make_store(spec: ExperimentSpec, workdir: str | None = None) -> ClientStore | None:
  """The client store ``clients.store`` asks for (None: device-resident clients).

  ``'disk'`` keeps its memory maps in ``clients.store_dir``, by default
  ``<workdir>/client_store`` (or a temporary folder without a workdir).
  """
  if spec.store == 'device':
    return None
  directory = None
  if spec.store == 'disk':
    directory = store_directory(spec, workdir) or tempfile.mkdtemp(prefix='fedjax_kd_store_')
  return ClientStore(spec.store, directory, chunk=spec.store_chunk)


def store_directory(spec: ExperimentSpec, workdir: str | None = None) -> str | None:
  """Where a ``clients.store='disk'`` store keeps its memory maps: ``clients.store_dir``, or
  ``<workdir>/client_store``; None for other stores (or a disk store with neither set)."""
  if spec.store != 'disk':
    return None
  return spec.store_dir or (os.path.join(workdir, 'client_store') if workdir else None)


# The config fields that feed the data and model libraries' parameters (they raise a ParamError
# naming their own parameter; the build names the field).
SPLIT_FIELDS = {'num_public': 'data.num_public', 'num_private': 'data.num_private', 'seed': 'seed'}
PARTITION_FIELDS = {
    'name': 'data.partition', 'num_clients': 'clients.num_clients', 'alpha': 'data.alpha',
    'seed': 'seed', 'shards_per_client': 'data.shards_per_client',
    'classes_per_client': 'data.classes_per_client', 'min_size': 'data.min_size',
    'fraction': 'data.dominant_fraction', 'dominant_fraction': 'data.dominant_fraction'}
MODEL_FIELDS = {'init': 'model.init', 'bn_momentum': 'model.bn_momentum',
                'bn_epsilon': 'model.bn_epsilon'}


def build(spec: ExperimentSpec, workdir: str | None = None) -> Experiment:
  """Loads data, partitions it, builds models and the algorithm (no training).

  ``workdir`` only places a ``clients.store='disk'`` store.
  """
  d = spec.data
  data_dir = d.data_dir or None
  with fields.as_fields({'label_key': 'data.label_key'}):
    dataset = sources.load_source(d.source, data_dir=data_dir, seed=spec.seed,
                                  field='data.source', label_key=d.label_key or None)
  sources.check_dataset(dataset, f'data.source={d.source!r}',
                        declared_classes=dataset.declared_classes)
  public = None
  if d.public_source:
    with fields.as_fields({}):
      public = sources.load_source(d.public_source, data_dir=data_dir, seed=spec.seed,
                                   field='data.public_source')
    sources.check_dataset(public, f'data.public_source={d.public_source!r}', labelled=False)
  vocab_size = _check_text_inputs(spec, dataset, public)
  # The open-data broadcast counts what a public sample costs on the wire: float32 values,
  # or the text source's own size (16-bit token ids, one bit per bag-of-words entry).
  shown = public if public is not None else dataset
  per_sample = shown.bytes_per_sample or float(math.prod(shown.x_train.shape[1:]) * 4)
  # data.normalize: one per-channel affine map (from the private source's training set) for
  # the private, public and test inputs alike. Float inputs are normalised here, once; uint8
  # pixels stay pixels (one byte each) and the kernels map them where they gather a batch.
  with fields.as_fields({'mean': 'data.mean'}):
    stats = sources.input_stats(d.normalize, dataset.x_train, d.mean, d.std)
  normalize = inputs_lib.Normalize.from_stats(stats)
  if stats is not None:
    norm = lambda ds: dataclasses.replace(ds, x_train=normalize.prepare(ds.x_train),
                                          x_test=normalize.prepare(ds.x_test))
    dataset = norm(dataset)
    if public is not None:
      if public.x_train.shape[-1] != dataset.x_train.shape[-1]:
        raise DataError(f'data.public_source: {public.x_train.shape[-1]} channels, but '
                        f'data.source has {dataset.x_train.shape[-1]}')
      public = norm(public)
  with fields.as_fields(SPLIT_FIELDS):
    split = splits.fd_split(dataset, num_public=d.num_public, num_private=d.num_private,
                            seed=spec.seed, public=public)
  # The split holds its own rows now; the loaded training arrays go before anything is placed
  # on the device, so at most two copies of the private images ever coexist (briefly).
  del dataset, public
  kwargs = dict(num_classes=split.num_classes, seed=spec.seed, alpha=d.alpha,
                shards_per_client=d.shards_per_client, classes_per_client=d.classes_per_client,
                dominant_fraction=d.dominant_fraction,
                min_size=d.min_size)
  with fields.as_fields(PARTITION_FIELDS):
    part = partition_lib.partition(d.partition, split.y_private, spec.num_clients,
                                   client_ids=split.client_ids_private, **kwargs)
  client_indices, val_indices = part.client_indices, None
  if d.val_fraction > 0:
    with fields.as_fields({'fraction': 'data.val_fraction', 'seed': 'seed'}):
      client_indices, val_indices = splits.client_validation_split(
          part.client_indices, d.val_fraction, spec.seed)
  largest = max(len(ix) for ix in client_indices)
  if spec.train.batch_size > largest:
    raise ConfigError('train.batch_size', spec.train.batch_size,
                      f'an integer <= {largest}, the largest client\'s training samples (a '
                      'larger batch is padding in every local step)')
  test_indices = None
  if d.per_client_test:
    with fields.as_fields(PARTITION_FIELDS):
      test_indices = partition_lib.partition_test_like(
          d.partition, part, split.y_test, spec.num_clients, num_classes=split.num_classes,
          seed=spec.seed)
  input_shape = tuple(split.x_private.shape[1:])
  data = build_federated_data(split.x_private, split.y_private, client_indices,
                              split.x_public, split.x_test, split.y_test, split.num_classes,
                              test_indices=test_indices, y_public=split.y_public,
                              val_indices=val_indices, normalize=normalize)
  num_classes = split.num_classes
  del split, part, client_indices, val_indices, test_indices   # the device copy is the one copy
  specs = list(dict.fromkeys(spec.client_models + (spec.server_model,)))
  modules = {}
  for s in specs:
    field = 'server.model' if s not in spec.client_models else 'clients.models'
    with fields.as_fields(MODEL_FIELDS):
      modules[s] = registry.get_model(s, num_classes=num_classes, input_shape=input_shape,
                                      field=field, init=spec.model.init,
                                      bn_momentum=spec.model.bn_momentum,
                                      bn_epsilon=spec.model.bn_epsilon, vocab_size=vocab_size)
  optimizers = {'train': make_optimizer(spec.train)}
  if spec.distill is not None:
    optimizers['distill'] = make_optimizer(spec.distill)
  fed = Federation(data, spec.client_models, modules, optimizers,
                   store=make_store(spec, workdir), compute_dtype=spec.train.compute_dtype)
  selector = selection_lib.ClientSelector(spec, data.client_labels(), data.client_n)
  ctx = Context(spec=spec, fed=fed, root=jax.random.PRNGKey(spec.seed), modules=modules,
                optimizers=optimizers,
                bytes_per_public_sample=per_sample,
                selector=selector, input_stats=stats)
  algorithm = algorithms.ALGORITHMS[spec.algorithm](ctx)
  return Experiment(spec=spec, ctx=ctx, algorithm=algorithm)


def _check_text_inputs(spec: ExperimentSpec, dataset: sources.ArrayDataset,
                       public: sources.ArrayDataset | None) -> int | None:
  """The vocabulary size of token-id inputs (None for others), after refusing what cannot
  apply to token ids: a public source of another kind or a larger vocabulary, input
  normalisation, image augmentation."""
  vocab = dataset.vocab_size
  if public is not None and public.vocab_size != vocab and (vocab is None or
                                                            public.vocab_size is None or
                                                            public.vocab_size > vocab):
    raise ConfigError('data.public_source', spec.data.public_source,
                      f'a source of the same input kind as data.source (token ids below '
                      f'{vocab})' if vocab else 'a source of the same input kind as '
                      'data.source (not token ids)')
  if vocab is None:
    return None
  if spec.data.normalize != 'unit':
    raise ConfigError('data.normalize', spec.data.normalize,
                      "'unit' (data.source holds token ids, which are not normalised)")
  if spec.data.augment != 'none':
    raise ConfigError('data.augment', spec.data.augment,
                      "'none' (data.source holds token ids, not images)")
  if getattr(algorithms.ALGORITHMS.get(spec.algorithm), 'synthesizes_inputs', False):
    raise ConfigError('algorithm', spec.algorithm, 'an algorithm that does not synthesize '
                      'inputs (data.source holds token ids, which cannot be optimised)')
  return int(vocab)


def participants(spec: ExperimentSpec, t: int) -> np.ndarray:
  """``[K]`` bool: the uniformly selected clients of round ``t`` (no dropout).

  Kept for scripts; runs go through `fedjax_kd.selection.ClientSelector`.
  """
  k = spec.num_clients
  mask = np.zeros(k, bool)
  if spec.participation >= 1.0:
    mask[:] = True
  else:
    mask[selection_ops.uniform_round(k, spec.selection.m, spec.seed, t)] = True
  return mask
