"""Builds an experiment from a validated spec: data, partition, models, algorithm.

Everything that can fail on bad input (data files, split sizes, partition
feasibility, model/input compatibility) runs here, before any compilation.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import jax
import numpy as np
import optax

from fedjax_kd import algorithms
from fedjax_kd import fields
from fedjax_kd import selection
from fedjax_kd.algorithms.base import Algorithm, Context
from fedjax_kd.config.spec import DataSpec, ExperimentSpec, OptimSpec
from fedjax_kd.core.federation import Federation
from fedjax_kd.core.store import ClientStore
from fedjax_kd.data import prepare as prepare_lib
from fedjax_kd.data.federated import build_federated_data
from fedjax_kd.errors import ConfigError
from fedjax_kd.models import registry
from fedjax_kd.running import memory as memory_lib


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
  """A built run: its spec, context (data, federation, models) and algorithm, and the
  device-memory plan it was built with (:func:`fedjax_kd.running.memory.choose`; its ``chunk`` is the
  federation's clients at once)."""
  spec: ExperimentSpec
  ctx: Context
  algorithm: Algorithm
  memory: memory_lib.MemoryPlan | None = None


def make_store(spec: ExperimentSpec, workdir: str | None = None) -> ClientStore | None:
  """The client store ``clients.store`` asks for (None: device-resident clients).

  ``'disk'`` keeps its memory maps in ``clients.store_dir``, by default
  ``<workdir>/client_store`` (or a temporary folder without a workdir).
  """
  if spec.clients.store == 'device':
    return None
  directory = None
  if spec.clients.store == 'disk':
    directory = store_directory(spec, workdir) or tempfile.mkdtemp(prefix='fedjax_kd_store_')
  return ClientStore(spec.clients.store, directory, chunk=spec.clients.store_chunk)


def store_directory(spec: ExperimentSpec, workdir: str | None = None) -> str | None:
  """Where a ``clients.store='disk'`` store keeps its memory maps: ``clients.store_dir``, or
  ``<workdir>/client_store``; None for other stores (or a disk store with neither set)."""
  if spec.clients.store != 'disk':
    return None
  return spec.clients.store_dir or (os.path.join(workdir, 'client_store') if workdir else None)


# The config fields that feed the data and model libraries' parameters (they raise a ParamError
# naming their own parameter; the build names the field).
DATA_FIELDS = {**{f.name: f'data.{f.name}' for f in dataclasses.fields(DataSpec)},
               'num_clients': 'clients.num_clients', 'seed': 'seed'}
MODEL_FIELDS = {'init': 'model.init', 'bn_momentum': 'model.bn_momentum',
                'bn_epsilon': 'model.bn_epsilon'}


def build(spec: ExperimentSpec, workdir: str | None = None, *,
          memory_check: bool = False) -> Experiment:
  """Loads data, partitions it, builds models, the federation and the algorithm, and plans
  the device memory (no training, nothing compiled).

  The order goes down the layers once: what the run's options fix alone (the optimizers,
  the client store), the data (loaded, split, partitioned and placed on the device), the
  models, the federation, the client selector and the algorithm, then the memory planner,
  which chooses how many clients each per-client phase runs at once (``clients.chunk='auto'``)
  before anything runs and, with ``memory_check``, refuses a run the device cannot hold
  (:func:`fedjax_kd.running.memory.check`: one line naming what would fit).

  ``workdir`` only places a ``clients.store='disk'`` store.
  """
  optimizers = {'train': make_optimizer(spec.train)}
  if spec.distill.optimizer is not None:
    optimizers['distill'] = make_optimizer(spec.distill.optimizer)
  store = make_store(spec, workdir)
  with fields.as_fields(DATA_FIELDS):
    prepared = prepare_lib.prepare(spec.data, num_clients=spec.clients.num_clients, seed=spec.seed)
  if prepared.vocab_size is not None and getattr(algorithms.ALGORITHMS.get(spec.algorithm),
                                                 'synthesizes_inputs', False):
    raise ConfigError('algorithm', spec.algorithm, 'an algorithm that does not synthesize '
                      'inputs (data.source holds token ids, which cannot be optimised)')
  split, client_indices = prepared.split, prepared.client_indices
  largest = max(len(ix) for ix in client_indices)
  if spec.train.batch_size > largest:
    raise ConfigError('train.batch_size', spec.train.batch_size,
                      f'an integer <= {largest}, the largest client\'s training samples (a '
                      'larger batch is padding in every local step)')
  input_shape = tuple(split.x_private.shape[1:])
  data = build_federated_data(split.x_private, split.y_private, client_indices,
                              split.x_public, split.x_test, split.y_test, split.num_classes,
                              test_indices=prepared.test_indices, y_public=split.y_public,
                              val_indices=prepared.val_indices, normalize=prepared.normalize)
  num_classes, vocab_size = split.num_classes, prepared.vocab_size
  stats, per_sample = prepared.stats, prepared.bytes_per_public_sample
  del split, client_indices, prepared   # the device copy is the one copy
  specs = list(dict.fromkeys(spec.clients.models + (spec.server.model,)))
  modules = {}
  for s in specs:
    field = 'server.model' if s not in spec.clients.models else 'clients.models'
    with fields.as_fields(MODEL_FIELDS):
      modules[s] = registry.get_model(s, num_classes=num_classes, input_shape=input_shape,
                                      field=field, init=spec.model.init,
                                      bn_momentum=spec.model.bn_momentum,
                                      bn_epsilon=spec.model.bn_epsilon, vocab_size=vocab_size)
  fed = Federation(data, spec.clients.models, modules, optimizers, store=store,
                   compute_dtype=spec.train.compute_dtype, client_chunk=spec.clients.chunk)
  selector = selection.ClientSelector(spec, data.client_labels(), data.client_n,
                                      method=selection.METHODS[spec.selection.method])
  ctx = Context(spec=spec, fed=fed, root=jax.random.PRNGKey(spec.seed), modules=modules,
                optimizers=optimizers,
                bytes_per_public_sample=per_sample,
                selector=selector, input_stats=stats)
  algorithm = algorithms.ALGORITHMS[spec.algorithm](ctx)
  # The last step down: the planner, from everything built so far (nothing initialised or
  # compiled), chooses the clients at once (clients.chunk); the federation's phases read it.
  built = Experiment(spec=spec, ctx=ctx, algorithm=algorithm)
  plan = memory_lib.check(built) if memory_check else memory_lib.choose(built)
  fed.client_chunk = plan.chunk
  return dataclasses.replace(built, memory=plan)


def participants(spec: ExperimentSpec, t: int) -> np.ndarray:
  """``[K]`` bool: the uniformly selected clients of round ``t`` (no dropout).

  Kept for scripts; runs go through `fedjax_kd.selection.ClientSelector`.
  """
  k = spec.clients.num_clients
  mask = np.zeros(k, bool)
  if spec.clients.participation >= 1.0:
    mask[:] = True
  else:
    mask[selection.uniform_round(k, spec.selection.m, spec.seed, t)] = True
  return mask
