"""Per-sample k-means over client soft labels (COMET).

Implements the server-side clustering of COMET: Y. J. Cho, J. Wang,
T. Chirvolu, G. Joshi, "Communication-Efficient and Model-Heterogeneous
Personalized Federated Learning via Clustered Knowledge Transfer", IEEE JSTSP
2023, as reproduced in SCARLET's code (Azuma et al., 2025): per-sample
clustering. For *each* public sample separately the server runs
k-means with ``c`` clusters over the ``K`` client probability vectors; every
client then distils on the centroid nearest (L2) to its own current prediction.

The authors use ``fast_pytorch_kmeans.KMeans(n_clusters=c)``; this module
mirrors it in pure JAX:
  * Euclidean distance, ties broken towards the lowest cluster index;
  * centroids initialised at ``c`` distinct data points chosen uniformly at
    random (with replacement among the valid points when a sample has fewer
    valid points than clusters);
  * Lloyd iterations, at most ``max_iter`` (100), stopping once the centroid
    shift -- here the largest L2 norm of a centroid's change -- is below
    ``tol`` (1e-4);
  * a cluster that receives no point becomes the zero vector (the library's
    NaN-to-zero quirk, ``empty='zero'``) or keeps its previous centroid
    (``empty='keep'``).

Inputs are stacked sample-major, ``points[n, K, C]``; a ``mask`` marks which
clients' vectors exist (absent or padded clients never influence a centroid).
Everything is jitted and vectorised over samples with ``vmap``; the random
initialisation of sample ``i`` uses ``fold_in(key, i)``, so a sample's result
does not depend on how many other samples are in the batch.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array

_EMPTY_MODES = ('zero', 'keep')


def _sq_dists(x: Array, centroids: Array) -> Array:
  """Squared Euclidean distances from each vector to each centroid.

  Args:
    x: ``[..., C]`` vectors.
    centroids: ``[c, C]`` centroids, or anything broadcastable against
      ``x[..., None, :]`` (e.g. ``[n, c, C]`` with ``x`` of shape
      ``[..., n, C]``).

  Returns:
    ``[..., c]`` squared distances.
  """
  diff = x[..., None, :] - centroids
  return jnp.sum(diff * diff, axis=-1)


def _init_indices(key: Array, mask: Array, num_clusters: int, ids: Array) -> Array:
  """Indices of the initial centroids of one sample.

  Draws ``num_clusters`` distinct valid points uniformly at random (a random
  ordering of a uniformly random subset); if fewer points are valid, draws
  them uniformly with replacement among the valid ones. Every point's random
  number is keyed by its id, not its position, so the same clients draw the
  same centroids whatever other (masked) rows the array holds.

  Args:
    key: PRNG key of this sample.
    mask: ``[K]`` bool, which points exist (at least one).
    num_clusters: ``c``.
    ids: ``[K]`` identity of each point (e.g. its global client id).

  Returns:
    ``[c]`` int32 point indices.
  """
  k_perm, k_repl = jax.random.split(key)

  def draw(k):
    return jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(k, i)))(ids)

  scores = jnp.where(mask, draw(k_perm), jnp.inf)
  order = jnp.argsort(scores)
  num_points = mask.shape[0]
  if num_points >= num_clusters:
    distinct = order[:num_clusters]
  else:
    distinct = jnp.zeros((num_clusters,), order.dtype)  # never selected
  with_repl = jax.vmap(lambda j: jnp.argmax(jnp.where(
      mask, draw(jax.random.fold_in(k_repl, j)), -1.0)))(jnp.arange(num_clusters))
  enough = jnp.sum(mask) >= num_clusters
  return jnp.where(enough, distinct, with_repl).astype(jnp.int32)


def _assign(points: Array, mask: Array, centroids: Array) -> Array:
  """Nearest centroid of each point (``[K]`` int32; 0 for masked points)."""
  idx = jnp.argmin(_sq_dists(points, centroids), axis=-1).astype(jnp.int32)
  return jnp.where(mask, idx, 0)


def _kmeans_one(points: Array, mask: Array, key: Array, ids: Array, num_clusters: int,
                max_iter: int, tol: Array, empty: str) -> tuple[Array, Array]:
  """k-means of one sample: ``points[K, C]``, ``mask[K]``.

  Returns:
    ``(centroids[c, C], assign[K])``.
  """
  init = points[_init_indices(key, mask, num_clusters, ids)]
  weights = mask.astype(points.dtype)

  def update(centroids):
    assign = _assign(points, mask, centroids)
    onehot = jax.nn.one_hot(assign, num_clusters, dtype=points.dtype)
    onehot = onehot * weights[:, None]  # [K, c]; masked points count 0
    counts = jnp.sum(onehot, axis=0)  # [c]
    sums = jnp.einsum('kj,kc->jc', onehot, points)
    means = sums / jnp.maximum(counts, 1.0)[:, None]
    fallback = jnp.zeros_like(centroids) if empty == 'zero' else centroids
    return jnp.where((counts > 0)[:, None], means, fallback)

  def cond(state):
    it, _, shift = state
    return jnp.logical_and(it < max_iter, shift >= tol)

  def body(state):
    it, centroids, _ = state
    new = update(centroids)
    shift = jnp.max(jnp.linalg.norm(new - centroids, axis=-1))
    return it + 1, new, shift

  state = (jnp.int32(0), init, jnp.asarray(jnp.inf, points.dtype))
  _, centroids, _ = lax.while_loop(cond, body, state)
  return centroids, _assign(points, mask, centroids)


@functools.partial(
    jax.jit, static_argnames=('num_clusters', 'max_iter', 'empty'))
def kmeans_per_sample(points: Array,
                      mask: Array,
                      num_clusters: int,
                      key: Array,
                      *,
                      max_iter: int = 100,
                      tol: float = 1e-4,
                      empty: str = 'zero',
                      ids: Array | None = None) -> tuple[Array, Array]:
  """COMET server step: k-means over the K client vectors of every sample.

  Args:
    points: ``[n, K, C]`` client probability vectors per public sample.
    mask: ``[K]`` or ``[n, K]`` bool, which clients' vectors exist; every row
      must have at least one valid point. Masked points never affect centroids.
    num_clusters: number of clusters ``c`` (static).
    key: PRNG key; sample ``i`` uses ``jax.random.fold_in(key, i)``.
    max_iter: maximum number of Lloyd iterations (static).
    tol: stop once the largest L2 norm of a centroid's change is ``< tol``.
    empty: what an empty cluster becomes: ``'zero'`` (the zero vector, as
      ``fast_pytorch_kmeans`` does) or ``'keep'`` (its previous centroid).
      Static.
    ids: ``[K]`` identity of each client (default ``0..K-1``); initial
      centroids are drawn by identity, so a subset of the clients in another
      layout (a round view) draws the same ones.

  Returns:
    ``(centroids, assign)``: ``centroids`` ``[n, c, C]`` and ``assign``
    ``[n, K]`` int32, the nearest final centroid of each point (lowest index on
    ties; arbitrary for masked points).

  Raises:
    ValueError: for an unknown ``empty`` mode or ``num_clusters < 1``.
  """
  if empty not in _EMPTY_MODES:
    raise ValueError(f'empty must be one of {_EMPTY_MODES}, got {empty!r}')
  if num_clusters < 1:
    raise ValueError(f'num_clusters must be >= 1, got {num_clusters}')
  points = jnp.asarray(points, jnp.float32)
  n, num_points = points.shape[:2]
  mask = jnp.broadcast_to(jnp.asarray(mask, bool), (n, num_points))
  keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(n))
  ids = jnp.arange(num_points) if ids is None else jnp.asarray(ids)
  tol = jnp.asarray(tol, points.dtype)
  one = functools.partial(
      _kmeans_one, num_clusters=num_clusters, max_iter=max_iter, tol=tol,
      empty=empty)
  return jax.vmap(one, in_axes=(0, 0, 0, None))(points, mask, keys, ids)


@jax.jit
def nearest_centroid(probs: Array, centroids: Array) -> Array:
  """COMET client step: the centroid nearest (L2) to each prediction.

  Args:
    probs: ``[..., n, C]`` current predictions (e.g. ``[K, n, C]`` for all
      clients at once).
    centroids: ``[n, c, C]`` per-sample centroids from
      :func:`kmeans_per_sample`.

  Returns:
    ``[..., n, C]``: for every prediction, the nearest centroid of its sample
    (lowest cluster index on ties).
  """
  idx = jnp.argmin(_sq_dists(probs, centroids), axis=-1)  # [..., n]
  full = jnp.broadcast_to(centroids, probs.shape[:-2] + centroids.shape)
  return jnp.take_along_axis(full, idx[..., None, None], axis=-2)[..., 0, :]
