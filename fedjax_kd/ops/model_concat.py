"""FedConcat's server math: per-cluster FedAvg and the concatenated linear classifier.

Y. Diao, Q. Li, B. He, "Exploiting Label Skews in Federated Learning with Model
Concatenation", AAAI 2024. Pure, jitted functions over pytrees:

* :func:`cluster_label_distributions` -- the one-time clustering: k-means on the clients'
  label distributions ``counts_k / n_k`` (the authors' ``sklearn.cluster.KMeans`` on
  ``client_distribution``), here Lloyd's with k-means++ seeding, best of ``n_init``
  (:func:`fedjax_kd.ops.label_cluster.kmeans_rows`), deterministic given the seed.
* :func:`gather_cluster_rows` -- every client starts its round from its cluster's model:
  row ``k`` becomes ``models[cluster_k]`` where ``mask_k`` holds.
* :func:`segment_weighted_average` -- FedAvg inside every cluster:
  ``w_c = sum_{k: cluster_k = c} p_k w_k / sum_{k: cluster_k = c} p_k``; a cluster whose
  clients carry no weight this round keeps its previous model.
* :func:`cluster_features` -- every cluster model's frozen penultimate features of a batch.
* :func:`concat_logits` -- the global model of the classifier phase:
  ``logits = [h_1(x), ..., h_C(x)] W + b`` with ``h_c`` the penultimate features of cluster
  ``c``'s frozen model (cluster-major concatenation, ``W`` ``[C d, n]``).
* :func:`stack_heads` -- the classifier that starts from the clusters' own final layers:
  ``W = [W_1; ...; W_C]``, ``b = sum_c b_c`` (the authors' start for CIFAR-100), whose logits
  are the sum of the cluster models' logits.
* :func:`torch_linear_init` -- PyTorch's ``nn.Linear`` initialisation (the authors' fresh
  classifier): ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))`` for the weights and the bias.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_kd.ops import label_cluster

Array = jax.Array
PyTree = Any


def cluster_label_distributions(counts, num_clusters: int, seed: int,
                                n_init: int = 10) -> np.ndarray:
  """``[K]`` int64 cluster of every client: k-means on its label distribution.

  Args:
    counts: ``[K, C]`` per-client label counts (every client holds a sample).
    num_clusters: the requested clusters; the effective number is at most the number of
      distinct distributions (every returned cluster has a client).
    seed: seeds the k-means++ draws.
    n_init: k-means++ restarts; the lowest inertia wins.

  Returns:
    Cluster ids in ``[0, k_eff)``, canonical: client 0's cluster is 0, the next new one met
    in client order is 1, and so on.
  """
  hist = label_cluster.label_histograms(counts)
  return label_cluster.kmeans_rows(hist, int(num_clusters), int(seed), n_init=n_init)


@jax.jit
def gather_cluster_rows(stacked: PyTree, models: PyTree, cluster: Array, mask: Array) -> PyTree:
  """Rows ``k`` with ``mask[k]`` set to ``models[cluster[k]]``, the others unchanged.

  Args:
    stacked: pytree with leaves ``[S, ...]`` (the clients' models).
    models: the same pytree with leaves ``[C, ...]`` (one model per cluster).
    cluster: ``[S]`` int cluster of every row.
    mask: ``[S]`` bool, which rows receive their cluster's model.
  """
  def put(c, m):
    rows = jnp.take(m, cluster, axis=0).astype(c.dtype)
    return jnp.where(mask.reshape((-1,) + (1,) * (c.ndim - 1)), rows, c)
  return jax.tree.map(put, stacked, models)


@functools.partial(jax.jit, static_argnames=('num_segments',))
def segment_weighted_average(stacked: PyTree, weights: Array, segments: Array,
                             num_segments: int, previous: PyTree) -> PyTree:
  """The weighted mean of every segment's rows; a segment without weight keeps ``previous``.

  Args:
    stacked: pytree with leaves ``[S, ...]``.
    weights: ``[S]`` nonnegative weights (e.g. ``n_k * active``).
    segments: ``[S]`` int segment (cluster) of every row, in ``[0, num_segments)``.
    num_segments: ``C`` (static).
    previous: pytree with leaves ``[C, ...]``: what a segment of zero total weight keeps.

  Returns:
    Leaves ``[C, ...]`` in the dtypes of ``previous``.
  """
  w = jnp.asarray(weights, jnp.float32)
  onehot = jax.nn.one_hot(segments, num_segments, dtype=jnp.float32) * w[:, None]   # [S, C]
  total = jnp.sum(onehot, axis=0)                                                   # [C]
  p = onehot / jnp.maximum(total, 1e-30)[None, :]

  def leaf(x, prev):
    mean = jnp.tensordot(p.T, x.astype(jnp.float32), axes=1)                        # [C, ...]
    keep = (total > 0).reshape((-1,) + (1,) * (prev.ndim - 1))
    return jnp.where(keep, mean, prev.astype(jnp.float32)).astype(prev.dtype)

  return jax.tree.map(leaf, stacked, previous)


def cluster_features(embed: Any, encoders: Any, x: Array) -> Array:
  """``[C, B, d]`` features of ``x`` under each of the ``C`` cluster models, gradient-free.

  Args:
    embed: ``embed(params, batch_stats, x) -> [B, d]``, one model's inference-mode
      penultimate features.
    encoders: the cluster models (a ``ModelState`` with leaves ``[C, ...]``).
    x: ``[B, ...]`` model inputs.
  """
  f = jax.vmap(lambda p, s: embed(p, s, x))(encoders.params, encoders.batch_stats)
  return jax.lax.stop_gradient(f)


def concat_features(features: Array) -> Array:
  """``[C, B, d]`` per-cluster features -> ``[B, C d]`` (cluster-major: cluster 0's first)."""
  c, b, d = features.shape
  return jnp.moveaxis(features, 0, 1).reshape(b, c * d)


def linear(classifier: dict, features: Array) -> Array:
  """``features @ W + b`` of a ``{'w': [D, n], 'b': [n]}`` classifier."""
  return features @ classifier['w'] + classifier['b']


@jax.jit
def concat_logits(features: Array, classifier: dict) -> Array:
  """The global model's logits ``[B, n]`` from the clusters' features ``[C, B, d]``."""
  return linear(classifier, concat_features(features))


@jax.jit
def stack_heads(kernels: Array, biases: Array) -> dict:
  """``{'w': [C d, n], 'b': [n]}`` from the clusters' final layers ``[C, d, n]``, ``[C, n]``."""
  c, d, n = kernels.shape
  return {'w': kernels.reshape(c * d, n), 'b': jnp.sum(biases, axis=0)}


def torch_linear_init(key: Array, fan_in: int, num_classes: int) -> dict:
  """``nn.Linear(fan_in, num_classes)``'s initialisation as ``{'w': [fan_in, n], 'b': [n]}``."""
  kw, kb = jax.random.split(key)
  bound = 1.0 / float(fan_in) ** 0.5
  return {'w': jax.random.uniform(kw, (fan_in, num_classes), jnp.float32, -bound, bound),
          'b': jax.random.uniform(kb, (num_classes,), jnp.float32, -bound, bound)}
