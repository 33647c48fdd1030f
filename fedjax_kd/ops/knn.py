"""kNN-Per's local-memorisation prediction: a Gaussian-kernel kNN on a client's
datastore of embeddings, interpolated with the global model.

O. Marfoq, G. Neglia, R. Vidal, L. Kameni, "Personalized Federated Learning
through Local Memorization", ICML 2022 (arXiv 2111.09360), Sec. 3; the authors'
``KNNPerClient.gather_knn_outputs`` (github.com/omarfoq/knn-per):

* neighbours: the ``k`` datastore entries nearest to the query embedding in
  squared Euclidean distance ``d`` (faiss ``IndexFlatL2``);
* kernel: ``w_j = exp(-d_j / (D * scale))`` with ``D`` the embedding dimension;
* ``p_kNN(y | x) = sum_j w_j 1[y_j = y] / sum_j w_j``;
* personalised prediction ``h(x) = lambda p_kNN(x) + (1 - lambda) p_global(x)``.

The kernel weights are computed relative to the nearest neighbour,
``exp(-(d_j - d_min) / (D scale))``: the normalised ``p_kNN`` is the same, and it
cannot underflow to 0/0 for far-away queries. With fewer than ``k`` real entries
the missing neighbours weigh 0 (faiss returns them at distance ~3e38); with no
entry at all a query has no kNN prediction and keeps the global one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


def squared_distances(q: Array, s: Array) -> Array:
  """``[m, n]`` squared Euclidean distances between rows of ``q`` ``[m, D]`` and ``s``
  ``[n, D]`` (float32, clipped at 0)."""
  q = q.astype(jnp.float32)
  s = s.astype(jnp.float32)
  d = (jnp.sum(q * q, -1)[:, None] + jnp.sum(s * s, -1)[None, :]
       - 2.0 * jnp.dot(q, s.T, precision=jax.lax.Precision.HIGHEST))
  return jnp.maximum(d, 0.0)


@functools.partial(jax.jit, static_argnames=('k', 'num_classes'))
def knn_probs(q: Array, store: Array, labels: Array, valid: Array, *, k: int, scale: float,
              num_classes: int, exclude: Array | None = None) -> tuple[Array, Array]:
  """Gaussian-kernel kNN class probabilities of queries against one datastore.

  Args:
    q: ``[m, D]`` query embeddings.
    store: ``[n, D]`` datastore embeddings.
    labels: ``[n]`` int datastore labels.
    valid: ``[n]`` bool, the real datastore rows (the rest is padding).
    k: neighbours (at most ``n`` are used).
    scale: the kernel scale (``w = exp(-d / (D scale))``).
    num_classes: C.
    exclude: optional ``[m]`` datastore position each query may not use (itself:
      leave-one-out); -1 or out of range for none.

  Returns:
    ``(p [m, C], has [m] bool)``: the kNN probabilities (zero rows where ``has`` is
    False: no real neighbour).
  """
  n, dim = store.shape
  d = squared_distances(q, store)
  d = jnp.where(valid[None, :], d, jnp.inf)
  if exclude is not None:
    d = jnp.where(jnp.arange(n)[None, :] == exclude[:, None], jnp.inf, d)
  neg, idx = jax.lax.top_k(-d, min(k, n))
  dist = -neg                                   # ascending
  ok = jnp.isfinite(dist)
  has = ok[:, 0]
  d0 = jnp.where(has, dist[:, 0], 0.0)[:, None]
  w = jnp.where(ok, jnp.exp(-(jnp.where(ok, dist, 0.0) - d0) / (dim * scale)), 0.0)
  onehot = jax.nn.one_hot(labels[idx], num_classes, dtype=jnp.float32)
  p = jnp.sum(w[..., None] * onehot, axis=1) / jnp.maximum(jnp.sum(w, -1), 1e-30)[:, None]
  return p, has


def interpolate(p_knn: Array, p_global: Array, lam: Array, has: Array | None = None) -> Array:
  """``lam p_kNN + (1 - lam) p_global`` (``p_global`` alone where ``has`` is False)."""
  p = lam * p_knn + (1.0 - lam) * p_global
  return p if has is None else jnp.where(has[..., None], p, p_global)


def grid_scores(p_knn: Array, has: Array, p_global: Array, y: Array, valid: Array,
                lams: Array) -> tuple[Array, Array]:
  """Accuracy and mean NLL ``[G]`` of the interpolated prediction for each ``lams[g]``
  over the real queries (``valid``); 0 (accuracy) and 0 (NLL) without any."""
  p = interpolate(p_knn[None], p_global[None], lams[:, None, None], has[None])   # [G, m, C]
  real = valid.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(real), 1.0)
  hit = (jnp.argmax(p, -1) == y[None]).astype(jnp.float32)
  py = jnp.take_along_axis(p, jnp.broadcast_to(y[None, :, None], p.shape[:2] + (1,)), -1)[..., 0]
  nll = -jnp.log(jnp.maximum(py, 1e-12))
  return jnp.sum(hit * real, -1) / count, jnp.sum(nll * real, -1) / count


def choose(scores: Array, grid: Array) -> Array:
  """The grid value with the highest score (the first, i.e. the smallest, on ties)."""
  return grid[jnp.argmax(scores, -1)]
